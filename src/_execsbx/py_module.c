/* exec_sandbox._execsbx: module definition (multi-phase init, per-module state), functions and
 * constants; the top of the binding: it includes the other py_*.h, none of them includes it.
 * Modelled on CPython's Modules/selectmodule.c. */
#include "py_common.h"

#include <errno.h>
#include <string.h>

#include "net_protocol.h"
#include "protocol.h"
#include "py_config.h"
#include "py_events.h"
#include "py_net_ring.h"
#include "py_vm.h"
#include "seccomp_policy.h"
#include "tsc.h"

PyMODINIT_FUNC PyInit__execsbx(void);

PyDoc_STRVAR(build_qemu_argv_doc,
	     "build_qemu_argv(*, qemu_binary, kernel, rootfs, memory_mb, vcpus, accel,\n"
	     "                kernel_cmdline_extra='', qmp=False, mem_path=None,\n"
	     "                mem_shared=False, incoming=False, qemu_sandbox=False,\n"
	     "                mem_fd=-1, disks=(), net_port=False) -> list[str]\n\n"
	     "The QEMU command line Vm() would run. disks: up to DISKS_MAX (path, kind,\n"
	     "writable) after the root disk, in this order (/dev/vdb, ...), each with the serial\n"
	     "'sbx-disk-<kind>' (kind: 1..10 lower-case letters, unique), read-only unless\n"
	     "writable. ValueError on an invalid configuration (',' in a path, accel not\n"
	     "'kvm'/'tcg', memory_mb out of range, a bad or repeated disk kind, ...).");

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
			  "(the GIL is released meanwhile); 0 when unknown: on non-x86_64 hosts, or\n"
			  "when the measurement failed.");

/* A failed measurement answers 0, not an exception: 0 is "unknown" in this function's contract
 * (the guest then boots without tsc_early_khz=), and no caller could do more with the reason
 * (docs/c-conventions.md lists this exception). */
static PyObject *tsc_khz(PyObject *module, PyObject *unused)
{
	(void)module;
	(void)unused;
	uint64_t khz = 0;
	struct sbx_err unknown = {0};
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = sbx_tsc_khz(&khz, &unknown);
	Py_END_ALLOW_THREADS
	return PyLong_FromUnsignedLongLong(rc < 0 ? 0 : khz);
}

PyDoc_STRVAR(seccomp_rules_doc,
	     "seccomp_rules(policy='allow') -> list[tuple[str, str, str]]\n\n"
	     "The host seccomp policy applied to QEMU, as data. 'allow' (the default policy):\n"
	     "(syscall, 'ALLOW' or 'ALLOW IF <condition>', the reason of its group); every other\n"
	     "call fails with ENOSYS. 'deny' (the fallback): (syscall, errno name, reason).\n"
	     "Which one a VM got is in its jail_status(); vm/jail.py's seccomp_policy() says\n"
	     "which this process uses.");

static int append_rule(PyObject *list, const char *name, const char *action, const char *why)
{
	return sbx_py_append_new(list, Py_BuildValue("(sss)", name, action, why));
}

static PyObject *allow_list_rules(void)
{
	PyObject *list = PyList_New(0);
	char name[64];
	for (size_t g = 0; list && g < sbx_seccomp_allow_group_count; g++) {
		const struct sbx_seccomp_group *grp = &sbx_seccomp_allow_groups[g];
		for (const char *p = grp->syscalls; *p;) {
			size_t n = strcspn(p, " ");
			if (n > 0 && n < sizeof(name)) {
				memcpy(name, p, n);
				name[n] = 0;
				char why[512];
				PyOS_snprintf(why, sizeof(why), "%s: %s", grp->name, grp->reason);
				if (append_rule(list, name, "ALLOW", why) < 0) {
					Py_CLEAR(list);
					return NULL;
				}
			}
			p += n;
			p += strspn(p, " ");
		}
	}
	for (size_t i = 0; list && i < sbx_seccomp_allow_arg_count; i++) {
		const struct sbx_seccomp_rule *r = &sbx_seccomp_allow_args[i];
		char action[96];
		PyOS_snprintf(action, sizeof(action), "ALLOW IF (arg%u & %#llx) == %#llx",
			      r->arg_index, (unsigned long long)r->mask,
			      (unsigned long long)r->value);
		if (append_rule(list, r->syscall, action, r->reason) < 0)
			Py_CLEAR(list);
	}
	return list;
}

static PyObject *seccomp_rules(PyObject *module, PyObject *args, PyObject *kwds)
{
	(void)module;
	static char *kwlist[] = {"policy", NULL};
	const char *policy = "allow";
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|s:seccomp_rules", kwlist, &policy))
		return NULL;
	if (strcmp(policy, "allow") == 0 || strcmp(policy, "log") == 0)
		return allow_list_rules();
	if (strcmp(policy, "deny") != 0) {
		PyErr_Format(PyExc_ValueError, "policy must be 'allow', 'deny' or 'log', not '%s'",
			     policy);
		return NULL;
	}
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
	{"seccomp_rules", (PyCFunction)(void (*)(void))seccomp_rules, METH_VARARGS | METH_KEYWORDS,
	 seccomp_rules_doc},
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
		{"EXIT_REPL_RESET", SBX_EXIT_REPL_RESET},
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
		{"TIMEOUT_NONE", SBX_TIMEOUT_NONE},
		{"RESEED_BYTES", SBX_RESEED_BYTES},
		{"MSG_FILE_WRITE_BEGIN", SBX_MSG_FILE_WRITE_BEGIN},
		{"MSG_FILE_WRITE_DATA", SBX_MSG_FILE_WRITE_DATA},
		{"MSG_FILE_WRITE_END", SBX_MSG_FILE_WRITE_END},
		{"MSG_FILE_READ", SBX_MSG_FILE_READ},
		{"MSG_FILE_LIST", SBX_MSG_FILE_LIST},
		{"FILE_EXECUTABLE", SBX_FILE_EXECUTABLE},
		{"FILE_NODE_SNAPSHOT", SBX_FILE_NODE_SNAPSHOT},
		{"NODE_TAG_SIZE", SBX_NODE_TAG_SIZE},
		{"FILE_ERR_PATH", SBX_FILE_ERR_PATH},
		{"FILE_ERR_NOT_FOUND", SBX_FILE_ERR_NOT_FOUND},
		{"FILE_ERR_IO", SBX_FILE_ERR_IO},
		{"FILE_ERR_TOO_LARGE", SBX_FILE_ERR_TOO_LARGE},
		{"FILE_ERR_PROTOCOL", SBX_FILE_ERR_PROTOCOL},
		{"FILE_ERR_REFUSED", SBX_FILE_ERR_REFUSED},
		{"FILE_SIZE_MAX", (long)SBX_FILE_SIZE_MAX},
		{"FILE_CHUNK_MAX", SBX_FILE_CHUNK_MAX},
		{"PATH_MAX", SBX_PATH_MAX},
		{"PATH_COMPONENT_MAX", SBX_PATH_COMPONENT_MAX},
		{"MSG_NET_CONFIG", SBX_MSG_NET_CONFIG},
		{"NET_NAME_MAX", SBX_NET_NAME_MAX},
		{"NET_NAMES_MAX", SBX_NET_NAMES_MAX},
		{"NET_EXTRA_PORTS_MAX", SBX_NET_EXTRA_PORTS_MAX},
		{"NET_CA_BUNDLE_MAX", SBX_NET_CA_BUNDLE_MAX},
		{"MSG_TOOL_RESULT", SBX_MSG_TOOL_RESULT},
		{"TOOL_OK", SBX_TOOL_OK},
		{"TOOL_ERROR", SBX_TOOL_ERROR},
		{"TOOL_RESULT_MAX", SBX_TOOL_RESULT_MAX},
		{"OUTPUT_BEGIN", SBX_OUTPUT_BEGIN},
		{"OUTPUT_END", SBX_OUTPUT_END},
		{"TOOL_NAME_MAX", SBX_TOOL_NAME_MAX},
		{"TOOL_ARGS_MAX", SBX_TOOL_ARGS_MAX},
		{"TOOL_CALLS_MAX", SBX_TOOL_CALLS_MAX},
		{"MIME_TYPE_MAX", SBX_MIME_TYPE_MAX},
		{"OUTPUT_DATA_MAX", SBX_OUTPUT_DATA_MAX},
		{"OUTPUT_ITEM_MAX", SBX_OUTPUT_ITEM_MAX},
		{"OUTPUTS_MAX", SBX_OUTPUTS_MAX},
		{"OUTPUT_BYTES_MAX", SBX_OUTPUT_BYTES_MAX},
		{"DISKS_MAX", SBX_VM_DISKS_MAX},
		{"ERR_NO_PROCESS", SBX_ERR_NO_PROCESS},
		{"ERR_LIMIT", SBX_ERR_LIMIT},
		{"MSG_PROC_SPAWN", SBX_MSG_PROC_SPAWN},
		{"MSG_PROC_READ", SBX_MSG_PROC_READ},
		{"MSG_PROC_WRITE", SBX_MSG_PROC_WRITE},
		{"MSG_PROC_SIGNAL", SBX_MSG_PROC_SIGNAL},
		{"MSG_PROC_WAIT", SBX_MSG_PROC_WAIT},
		{"MSG_PROC_LIST", SBX_MSG_PROC_LIST},
		{"MSG_PROC_RESIZE", SBX_MSG_PROC_RESIZE},
		{"SPAWN_PTY", SBX_SPAWN_PTY},
		{"PROC_RUNNING", SBX_PROC_RUNNING},
		{"PROC_PTY", SBX_PROC_PTY},
		{"PROC_STDIN_OPEN", SBX_PROC_STDIN_OPEN},
		{"PROC_STDOUT", SBX_PROC_STDOUT},
		{"PROC_STDERR", SBX_PROC_STDERR},
		{"PROC_DATA_EOF", SBX_PROC_DATA_EOF},
		{"PROC_CLOSE_STDIN", SBX_PROC_CLOSE_STDIN},
		{"PROC_MAX", SBX_PROC_MAX},
		{"PROC_TRACKED_MAX", SBX_PROC_TRACKED_MAX},
		{"PROC_PENDING_MAX", SBX_PROC_PENDING_MAX},
		{"PROC_ARGV_MAX", SBX_PROC_ARGV_MAX},
		{"PROC_ARG_MAX", SBX_PROC_ARG_MAX},
		{"PROC_COMMAND_MAX", SBX_PROC_COMMAND_MAX},
		{"PROC_TTY_MAX", SBX_PROC_TTY_MAX},
		{"PROC_WAIT_MS_MAX", SBX_PROC_WAIT_MS_MAX},
		{"PROC_WRITE_MAX", SBX_PROC_WRITE_MAX},
		{"PROC_BUFFER_MAX", SBX_PROC_BUFFER_MAX},
		{"PROC_BUFFERS_TOTAL_MAX", SBX_PROC_BUFFERS_TOTAL_MAX},
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
	if (sbx_py_vm_type_add(m, st) < 0 || sbx_py_event_types_add(m, st) < 0)
		return -1;
	if (sbx_py_net_ring_type_add(m, st) < 0)
		return -1;
	return add_constants(m);
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
	sbx_module_state *st = PyModule_GetState(m);
	Py_VISIT(st->vm_type);
	Py_VISIT(st->net_ring_type);
	Py_VISIT(st->protocol_error);
	for (int i = 0; i < SBX_PY_EVENT_TYPES; i++)
		Py_VISIT(st->event_types[i]);
	for (int i = 0; i < SBX_PY_NET_EVENT_TYPES; i++)
		Py_VISIT(st->net_event_types[i]);
	return 0;
}

static int module_clear(PyObject *m)
{
	sbx_module_state *st = PyModule_GetState(m);
	Py_CLEAR(st->vm_type);
	Py_CLEAR(st->net_ring_type);
	Py_CLEAR(st->protocol_error);
	for (int i = 0; i < SBX_PY_EVENT_TYPES; i++)
		Py_CLEAR(st->event_types[i]);
	for (int i = 0; i < SBX_PY_NET_EVENT_TYPES; i++)
		Py_CLEAR(st->net_event_types[i]);
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
