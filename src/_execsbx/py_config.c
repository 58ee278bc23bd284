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
	for (unsigned i = 0; i < SBX_VM_DISKS_MAX; i++) {
		Py_CLEAR(pc->disk_paths[i]);
		Py_CLEAR(pc->disk_kinds[i]);
	}
}

/* PyUnicode_FSConverter that leaves *addr NULL for None (an optional path). */
static int fs_converter_or_none(PyObject *arg, void *addr)
{
	if (arg == Py_None)
		return 1;
	return PyUnicode_FSConverter(arg, addr);
}

/* disks: None or a sequence of (path, kind, writable[, qcow2, backing, max_bytes]) tuples ->
 * pc->disks (qemu_argv.h: backing is 1 + an index, 0 none; max_bytes 0: the file's size). The kinds and paths
 * are checked by sbx_qemu_argv_build like every other field; only what cannot be held here
 * (too many, not a tuple, a kind that is no str or holds a NUL) is refused here. 0 or -1. */
static int parse_disks(PyObject *arg, struct sbx_parsed_config *pc)
{
	if (!arg || arg == Py_None)
		return 0;
	PyObject *seq = PySequence_Fast(arg, "disks must be a sequence of (path, kind, writable)");
	if (!seq)
		return -1;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	if (n > (Py_ssize_t)SBX_VM_DISKS_MAX) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "at most %u disks", SBX_VM_DISKS_MAX);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
		PyObject *path = NULL, *kind = NULL;
		int writable = 0, qcow2 = 0;
		unsigned int backing = 0;
		unsigned long long max_bytes = 0;
		if (!PyTuple_Check(item) ||
		    !PyArg_ParseTuple(item, "O&Up|pIK;disks items are (path, kind, writable[, qcow2, backing, max_bytes])",
				      PyUnicode_FSConverter, &path, &kind, &writable, &qcow2,
				      &backing, &max_bytes)) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError,
						"disks items are (path, kind, writable) tuples");
			Py_DECREF(seq);
			return -1;
		}
		pc->disk_paths[i] = path; /* owned from here on */
		Py_ssize_t len;
		const char *k = PyUnicode_AsUTF8AndSize(kind, &len);
		if (!k || (size_t)len != strlen(k)) {
			if (k)
				PyErr_SetString(PyExc_ValueError,
						"disk kind must be 1..10 lower-case letters");
			Py_DECREF(seq);
			return -1;
		}
		pc->disk_kinds[i] = Py_NewRef(kind);
		pc->disks[i] = (struct sbx_vm_disk){.path = PyBytes_AS_STRING(path),
						     .kind = k,
						     .writable = writable,
						     .qcow2 = qcow2,
						     .backing = backing,
						     .max_bytes = max_bytes};
	}
	Py_DECREF(seq);
	pc->cfg.disks = pc->disks;
	pc->cfg.ndisks = (unsigned)n;
	return 0;
}

int sbx_parse_vm_config(PyObject *args, PyObject *kwds, const char *fname, int defaults,
			struct sbx_parsed_config *pc)
{
	static char *kwlist[] = {"qemu_binary", "kernel", "rootfs", "memory_mb", "vcpus",
				 "accel", "kernel_cmdline_extra", "qmp", "mem_path", "mem_shared",
				 "incoming", "qemu_sandbox", "mem_fd", "disks", "net_port",
				 NULL};
	int memory_mb = INT_MIN, vcpus = defaults ? 1 : INT_MIN;
	const char *accel = defaults ? "tcg" : NULL;
	const char *extra = "";
	PyObject *disks = NULL;
	int qmp = 0, mem_shared = 0, incoming = 0;
	int qemu_sandbox = 0, net_port = 0;
	int mem_fd = -1;
	char fmt[64];

	memset(pc, 0, sizeof(*pc));
	/* All keyword-only ("$" needs "|", so required ones are checked by hand below). */
	PyOS_snprintf(fmt, sizeof(fmt), "|$O&O&O&iisspO&pppiOp:%s", fname);
	if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, PyUnicode_FSConverter,
					 &pc->qemu_binary, PyUnicode_FSConverter, &pc->kernel,
					 PyUnicode_FSConverter, &pc->rootfs, &memory_mb, &vcpus, &accel,
					 &extra, &qmp, fs_converter_or_none, &pc->mem_path,
					 &mem_shared, &incoming, &qemu_sandbox, &mem_fd,
					 &disks, &net_port))
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
	pc->cfg.net_port = net_port;
	if (parse_disks(disks, pc) < 0)
		goto fail;
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
