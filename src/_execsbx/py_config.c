/* Vm()/build_qemu_argv() arguments -> struct sbx_vm_config: see py_config.h. */
#include "py_config.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include "py_errors.h"

void sbx_parsed_config_release(struct sbx_parsed_config *pc)
{
	Py_CLEAR(pc->qemu_binary);
	Py_CLEAR(pc->kernel);
	Py_CLEAR(pc->rootfs);
	Py_CLEAR(pc->mem_path);
	Py_CLEAR(pc->layer);
}

/* PyUnicode_FSConverter that leaves *addr NULL for None (an optional path). */
static int fs_converter_or_none(PyObject *arg, void *addr)
{
	if (arg == Py_None)
		return 1;
	return PyUnicode_FSConverter(arg, addr);
}

int sbx_parse_vm_config(PyObject *args, PyObject *kwds, const char *fname, int defaults,
			struct sbx_parsed_config *pc)
{
	static char *kwlist[] = {"qemu_binary", "kernel", "rootfs", "memory_mb", "vcpus",
				 "accel", "kernel_cmdline_extra", "qmp", "mem_path", "mem_shared",
				 "incoming", "qemu_sandbox", "mem_fd", "layer", "layer_kind", "net_port",
				 NULL};
	int memory_mb = INT_MIN, vcpus = defaults ? 1 : INT_MIN;
	const char *accel = defaults ? "tcg" : NULL;
	const char *extra = "";
	const char *layer_kind = NULL;
	int qmp = 0, mem_shared = 0, incoming = 0;
	int qemu_sandbox = 0, net_port = 0;
	int mem_fd = -1;
	char fmt[64];

	memset(pc, 0, sizeof(*pc));
	/* All keyword-only ("$" needs "|", so required ones are checked by hand below). */
	PyOS_snprintf(fmt, sizeof(fmt), "|$O&O&O&iisspO&pppiO&zp:%s", fname);
	if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, PyUnicode_FSConverter,
					 &pc->qemu_binary, PyUnicode_FSConverter, &pc->kernel,
					 PyUnicode_FSConverter, &pc->rootfs, &memory_mb, &vcpus, &accel,
					 &extra, &qmp, fs_converter_or_none, &pc->mem_path,
					 &mem_shared, &incoming, &qemu_sandbox, &mem_fd,
					 fs_converter_or_none, &pc->layer, &layer_kind, &net_port))
		goto fail;
	const char *missing = !pc->qemu_binary      ? "qemu_binary"
			      : !pc->kernel         ? "kernel"
			      : !pc->rootfs         ? "rootfs"
			      : memory_mb == INT_MIN ? "memory_mb"
			      : vcpus == INT_MIN    ? "vcpus"
			      : !accel              ? "accel"
						    : NULL;
	if (missing) {
		PyErr_Format(PyExc_TypeError, "%s() missing required keyword-only argument: '%s'",
			     fname, missing);
		goto fail;
	}
	if (memory_mb < 0 || vcpus < 0) {
		PyErr_SetString(PyExc_ValueError, memory_mb < 0 ? "memory_mb must not be negative"
								: "vcpus must not be negative");
		goto fail;
	}
	pc->cfg.qemu_binary = PyBytes_AS_STRING(pc->qemu_binary);
	pc->cfg.kernel = PyBytes_AS_STRING(pc->kernel);
	pc->cfg.rootfs = PyBytes_AS_STRING(pc->rootfs);
	pc->cfg.memory_mb = (unsigned)memory_mb;
	pc->cfg.vcpus = (unsigned)vcpus;
	pc->cfg.accel = accel; /* UTF-8 owned by the str argument, alive for the call */
	pc->cfg.kernel_cmdline_extra = extra;
	pc->cfg.qmp = qmp;
	pc->cfg.mem_path = pc->mem_path ? PyBytes_AS_STRING(pc->mem_path) : NULL;
	pc->cfg.mem_shared = mem_shared;
	pc->cfg.incoming = incoming;
	pc->cfg.qemu_sandbox = qemu_sandbox;
	pc->cfg.layer = pc->layer ? PyBytes_AS_STRING(pc->layer) : NULL;
	pc->cfg.layer_kind = layer_kind; /* owned by the str argument, alive for the call */
	pc->cfg.net_port = net_port;
	if (mem_fd < -1) {
		PyErr_SetString(PyExc_ValueError, "mem_fd must be a file descriptor or -1");
		goto fail;
	}
	pc->mem_fd = mem_fd;
	pc->cfg.mem_fd = mem_fd >= 0;
	return 0;
fail:
	sbx_parsed_config_release(pc);
	return -1;
}

char **sbx_build_argv_or_raise(const struct sbx_vm_config *cfg)
{
	char **argv = NULL;
	struct sbx_err err = {0};
	if (sbx_qemu_argv_build(cfg, &argv, &err) < 0) {
		sbx_raise_err(&err, NULL);
		return NULL;
	}
	return argv;
}
