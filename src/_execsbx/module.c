/* exec_sandbox._execsbx: module definition (multi-phase init, per-module state), functions and
 * constants. Modelled on CPython's Modules/selectmodule.c. */
#include "binding.h"
#include "seccomp_policy.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include "protocol.h"
#include "request.h"
#include "tsc.h"

PyMODINIT_FUNC PyInit__execsbx(void);

PyObject *sbx_raise_os_error(int err, const char *where, PyObject *filename)
{
	PyObject *msg = PyUnicode_FromFormat("%s (from %s)", strerror(err), where);
	if (!msg)
		return NULL;
	PyObject *exc = filename ? PyObject_CallFunction(PyExc_OSError, "iNO", err, msg, filename)
				 : PyObject_CallFunction(PyExc_OSError, "iN", err, msg);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

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
	const char *why = "invalid VM configuration";
	int rc = sbx_qemu_argv_build(cfg, &argv, &why);
	if (rc == -ENOMEM) {
		PyErr_NoMemory();
		return NULL;
	}
	if (rc < 0) {
		PyErr_SetString(PyExc_ValueError, why);
		return NULL;
	}
	return argv;
}

PyDoc_STRVAR(build_qemu_argv_doc,
	     "build_qemu_argv(*, qemu_binary, kernel, rootfs, memory_mb, vcpus, accel,\n"
	     "                kernel_cmdline_extra='', qmp=False, mem_path=None,\n"
	     "                mem_shared=False, incoming=False, qemu_sandbox=False,\n"
	     "                mem_fd=-1, layer=None, layer_kind=None, net_port=False)\n"
	     "                -> list[str]\n\n"
	     "The QEMU command line Vm() would run. ValueError on an invalid configuration\n"
	     "(',' in a kernel/rootfs path, accel not 'kvm'/'tcg', memory_mb out of range, ...).");

static PyObject *build_qemu_argv(PyObject *module, PyObject *args, PyObject *kwds)
{
	(void)module;
	struct sbx_parsed_config pc;
	if (sbx_parse_vm_config(args, kwds, "build_qemu_argv", 0, &pc) < 0)
		return NULL;
	char **argv = sbx_build_argv_or_raise(&pc.cfg);
	sbx_parsed_config_release(&pc);
	if (!argv)
		return NULL;
	unsigned n = sbx_argv_count(argv);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (unsigned i = 0; list && i < n; i++) {
		PyObject *s = PyUnicode_DecodeFSDefault(argv[i]);
		if (!s) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, s);
	}
	sbx_argv_free(argv);
	return list;
}

PyDoc_STRVAR(tsc_khz_doc, "tsc_khz() -> int\n\n"
			  "The TSC frequency in kHz measured against CLOCK_MONOTONIC over ~25 ms\n"
			  "(the GIL is released meanwhile); 0 on non-x86_64 hosts.");

static PyObject *tsc_khz(PyObject *module, PyObject *unused)
{
	(void)module;
	(void)unused;
	uint64_t khz;
	Py_BEGIN_ALLOW_THREADS
	khz = sbx_tsc_khz();
	Py_END_ALLOW_THREADS
	return PyLong_FromUnsignedLongLong(khz);
}

PyDoc_STRVAR(seccomp_rules_doc,
	     "seccomp_rules() -> list[tuple[str, str, str]]\n\n"
	     "The host seccomp deny-list applied to QEMU: (syscall, errno name, reason).");

static PyObject *seccomp_rules(PyObject *module, PyObject *unused)
{
	(void)module;
	(void)unused;
	PyObject *list = PyList_New((Py_ssize_t)sbx_seccomp_rule_count);
	for (size_t i = 0; list && i < sbx_seccomp_rule_count; i++) {
		const struct sbx_seccomp_rule *r = &sbx_seccomp_rules[i];
		PyObject *t = Py_BuildValue("(sss)", r->syscall,
					    r->error == ENOSYS ? "ENOSYS" : "EPERM", r->reason);
		if (!t) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, t);
	}
	return list;
}

static PyMethodDef module_methods[] = {
	{"seccomp_rules", seccomp_rules, METH_NOARGS, seccomp_rules_doc},
	{"build_qemu_argv", (PyCFunction)(void (*)(void))build_qemu_argv,
	 METH_VARARGS | METH_KEYWORDS, build_qemu_argv_doc},
	{"tsc_khz", tsc_khz, METH_NOARGS, tsc_khz_doc},
	{NULL, NULL, 0, NULL},
};

static int add_constants(PyObject *m)
{
	static const struct {
		const char *name;
		long value;
	} ints[] = {
		{"PROTOCOL_VERSION", SBX_PROTOCOL_VERSION},
		{"LANG_PYTHON", SBX_LANG_PYTHON},
		{"LANG_JAVASCRIPT", SBX_LANG_JAVASCRIPT},
		{"LANG_RAW", SBX_LANG_RAW},
		{"EXIT_TIMED_OUT", SBX_EXIT_TIMED_OUT},
		{"EXIT_STDOUT_LIMIT", SBX_EXIT_STDOUT_LIMIT},
		{"EXIT_STDERR_LIMIT", SBX_EXIT_STDERR_LIMIT},
		{"ERR_BAD_REQUEST", SBX_ERR_BAD_REQUEST},
		{"ERR_BUSY", SBX_ERR_BUSY},
		{"ERR_SPAWN", SBX_ERR_SPAWN},
		{"ERR_INTERNAL", SBX_ERR_INTERNAL},
		{"CODE_MAX", SBX_CODE_MAX},
		{"HOST_FRAME_MAX", SBX_HOST_FRAME_MAX},
		{"GUEST_FRAME_MAX", SBX_GUEST_FRAME_MAX},
		{"OUTPUT_CHUNK_MAX", SBX_OUTPUT_CHUNK_MAX},
		{"ENV_MAX_COUNT", SBX_ENV_MAX_COUNT},
		{"ENV_NAME_MAX", SBX_ENV_NAME_MAX},
		{"ENV_VALUE_MAX", SBX_ENV_VALUE_MAX},
		{"ERROR_MESSAGE_MAX", SBX_ERROR_MESSAGE_MAX},
		{"STDOUT_LIMIT_DEFAULT", SBX_STDOUT_LIMIT_DEFAULT},
		{"STDERR_LIMIT_DEFAULT", SBX_STDERR_LIMIT_DEFAULT},
		{"TIMEOUT_MS_MIN", SBX_TIMEOUT_MS_MIN},
		{"TIMEOUT_MS_MAX", SBX_TIMEOUT_MS_MAX},
		{"RESEED_BYTES", SBX_RESEED_BYTES},
		{"MSG_FILE_WRITE_BEGIN", SBX_MSG_FILE_WRITE_BEGIN},
		{"MSG_FILE_WRITE_DATA", SBX_MSG_FILE_WRITE_DATA},
		{"MSG_FILE_WRITE_END", SBX_MSG_FILE_WRITE_END},
		{"MSG_FILE_READ", SBX_MSG_FILE_READ},
		{"MSG_FILE_LIST", SBX_MSG_FILE_LIST},
		{"FILE_EXECUTABLE", SBX_FILE_EXECUTABLE},
		{"FILE_ERR_PATH", SBX_FILE_ERR_PATH},
		{"FILE_ERR_NOT_FOUND", SBX_FILE_ERR_NOT_FOUND},
		{"FILE_ERR_IO", SBX_FILE_ERR_IO},
		{"FILE_ERR_TOO_LARGE", SBX_FILE_ERR_TOO_LARGE},
		{"FILE_ERR_PROTOCOL", SBX_FILE_ERR_PROTOCOL},
		{"FILE_SIZE_MAX", (long)SBX_FILE_SIZE_MAX},
		{"FILE_CHUNK_MAX", SBX_FILE_CHUNK_MAX},
		{"PATH_MAX", SBX_PATH_MAX},
		{"PATH_COMPONENT_MAX", SBX_PATH_COMPONENT_MAX},
	};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		if (PyModule_AddIntConstant(m, ints[i].name, ints[i].value) < 0)
			return -1;
	return PyModule_AddStringConstant(m, "CHANNEL_PORT_NAME", SBX_CHANNEL_PORT_NAME);
}

PyDoc_STRVAR(protocol_error_doc,
	     "The guest broke the wire protocol (bad header, oversized frame, unknown type,\n"
	     "malformed payload). errno is EPROTO or EMSGSIZE; .events lists the events decoded\n"
	     "before the violation in the same read_events() call. Sticky: every later\n"
	     "Vm.read_events() raises it again.");

static int module_exec(PyObject *m)
{
	sbx_module_state *st = PyModule_GetState(m);
	st->protocol_error = PyErr_NewExceptionWithDoc("exec_sandbox._execsbx.ProtocolError",
						       protocol_error_doc, PyExc_OSError, NULL);
	if (!st->protocol_error)
		return -1;
	if (PyModule_AddObjectRef(m, "ProtocolError", st->protocol_error) < 0)
		return -1;
	if (sbx_vm_type_add(m, st) < 0)
		return -1;
	if (sbx_net_ring_type_add(m, st) < 0)
		return -1;
	return add_constants(m);
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
	sbx_module_state *st = PyModule_GetState(m);
	Py_VISIT(st->vm_type);
	Py_VISIT(st->net_ring_type);
	Py_VISIT(st->protocol_error);
	return 0;
}

static int module_clear(PyObject *m)
{
	sbx_module_state *st = PyModule_GetState(m);
	Py_CLEAR(st->vm_type);
	Py_CLEAR(st->net_ring_type);
	Py_CLEAR(st->protocol_error);
	return 0;
}

static void module_free(void *m)
{
	module_clear((PyObject *)m);
}

static PyModuleDef_Slot module_slots[] = {
	{Py_mod_exec, (void *)module_exec},
#ifdef Py_mod_multiple_interpreters
	/* No process-global Python state: safe under a per-interpreter GIL. */
	{Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
	{0, NULL},
};

PyDoc_STRVAR(module_doc, "Host-side core of exec-sandbox: QEMU command line, process spawning and "
			 "the agent channel codec.");

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "exec_sandbox._execsbx",
	.m_doc = module_doc,
	.m_size = sizeof(sbx_module_state),
	.m_methods = module_methods,
	.m_slots = module_slots,
	.m_traverse = module_traverse,
	.m_clear = module_clear,
	.m_free = module_free,
};

PyMODINIT_FUNC PyInit__execsbx(void)
{
	return PyModuleDef_Init(&module_def);
}
