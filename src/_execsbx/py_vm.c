/* exec_sandbox._execsbx.Vm: a heap type wrapping struct sbx_vm (vm.h). Every method is
 * non-blocking (the constructor returns right after the fork; spawn_fd tells when the exec
 * happened) except wait_spawn() and close()/dealloc (reaping a SIGKILLed QEMU and removing its
 * cgroup, GIL released: an event loop calls close() once the pidfd is readable, from a thread).
 * Nothing here calls back into Python code. What the methods do lives with its owner: requests in
 * py_requests.c, events in py_events.c, the jail in py_jail.c; errors become exceptions in
 * py_errors.c. */
#include "py_vm.h"

#include <errno.h>
#include <string.h>

#include "py_config.h"
#include "py_errors.h"
#include "py_events.h"
#include "py_jail.h"
#include "py_requests.h"
#include "vm.h"

/* Per read_console() call. */
#define SBX_READ_CONSOLE_MAX (64u * 1024u)

typedef struct {
	PyObject_HEAD
	struct sbx_vm vm;
	PyObject *qemu_binary; /* bytes: the filename of an execve error */
} VmObject;

static sbx_module_state *vm_state(VmObject *self)
{
	/* The type is not subclassable, so Py_TYPE(self) is the heap type made from module. */
	return PyType_GetModuleState(Py_TYPE(self));
}

static int check_open(VmObject *self)
{
	return sbx_raise_if_closed(self->vm.closed);
}

static PyObject *vm_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	struct sbx_parsed_config pc;
	struct sbx_jail_config jcfg;
	struct sbx_py_jail_storage jstore;
	/* "jail" is Vm's own; the rest is shared with build_qemu_argv. */
	PyObject *rest = kwds ? PyDict_Copy(kwds) : PyDict_New();
	if (!rest)
		return NULL;
	PyObject *o_jail = PyDict_GetItemString(rest, "jail"); /* borrowed */
	Py_XINCREF(o_jail);
	if (o_jail && PyDict_DelItemString(rest, "jail") < 0) {
		Py_DECREF(o_jail);
		Py_DECREF(rest);
		return NULL;
	}
	int prc = sbx_py_parse_jail(o_jail, &jcfg, &jstore);
	Py_XDECREF(o_jail);
	if (prc < 0 || sbx_parse_vm_config(args, rest, "Vm", 1, &pc) < 0) {
		sbx_py_jail_release(&jstore);
		Py_DECREF(rest);
		return NULL;
	}
	Py_DECREF(rest);
	/* Under the jail the images go to QEMU as fds the host opened: its root has no such paths,
	 * and its uid could not open them in the caller's directories. */
	pc.cfg.images_by_fd = jcfg.enabled;
	char **argv = sbx_build_argv_or_raise(&pc.cfg);
	if (!argv) {
		sbx_py_jail_release(&jstore);
		sbx_parsed_config_release(&pc);
		return NULL;
	}
	VmObject *self = (VmObject *)type->tp_alloc(type, 0);
	if (!self) {
		sbx_argv_free(argv);
		sbx_py_jail_release(&jstore);
		sbx_parsed_config_release(&pc);
		return NULL;
	}
	sbx_vm_init(&self->vm);
	self->qemu_binary = Py_NewRef(pc.qemu_binary);

	/* Returns right after the fork: whether QEMU's exec worked is told by spawn_fd becoming
	 * readable (check_spawn / wait_spawn). The fork stays on the calling thread: PDEATHSIG is
	 * tied to it. Without the GIL: copying a large process's page tables takes milliseconds,
	 * which the other threads (the event loop's, when a spawner thread calls this) need not
	 * wait for. Nothing below touches a Python object: self is not visible to anyone yet. */
	struct sbx_err err = {0};
	struct sbx_vm_start_opts opts = {
		.jail = jcfg.enabled ? &jcfg : NULL,
		.with_qmp = pc.cfg.qmp,
		.with_mem = pc.mem_fd >= 0,
		.mem_fd = pc.mem_fd,
		.with_net = pc.cfg.net_port,
		.kernel = pc.cfg.images_by_fd ? pc.cfg.kernel : NULL,
		.rootfs = pc.cfg.rootfs,
		.disks = pc.cfg.disks,
		.ndisks = pc.cfg.ndisks,
	};
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = sbx_vm_start(&self->vm, argv, &opts, &err);
	Py_END_ALLOW_THREADS
	sbx_argv_free(argv);
	sbx_py_jail_release(&jstore);
	sbx_parsed_config_release(&pc);
	if (rc < 0) {
		sbx_raise_err(&err, NULL);
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

/* 1, 0, or -1 with the exception of a start that failed before QEMU's exec. */
static int spawn_result(VmObject *self, int blocking)
{
	struct sbx_err err = {0};
	int rc;
	if (blocking) {
		Py_BEGIN_ALLOW_THREADS
		rc = sbx_vm_start_check(&self->vm, 1, &err);
		Py_END_ALLOW_THREADS
	} else {
		rc = sbx_vm_start_check(&self->vm, 0, &err);
	}
	if (rc >= 0)
		return rc;
	/* A missing or unusable QEMU binary: the OSError names it (FileNotFoundError ...). */
	PyObject *filename = NULL;
	if (err.syscall && strcmp(err.msg, "execve") == 0)
		filename = PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(self->qemu_binary),
							    PyBytes_GET_SIZE(self->qemu_binary));
	if (!PyErr_Occurred())
		sbx_raise_err(&err, filename);
	Py_XDECREF(filename);
	return -1;
}

PyDoc_STRVAR(check_spawn_doc,
	     "check_spawn() -> bool\n\n"
	     "Non-blocking: True once QEMU has exec'd, False while the child is still on its way\n"
	     "(wait for spawn_fd to be readable). If it failed before its exec, raises the\n"
	     "OSError(errno, '... (from <step>)') Vm() used to raise (FileNotFoundError with the\n"
	     "binary as filename for a missing QEMU), every time it is asked; close() reaps it.");

static PyObject *vm_check_spawn(VmObject *self, PyObject *unused)
{
	(void)unused;
	int rc = spawn_result(self, 0);
	if (rc < 0)
		return NULL;
	return PyBool_FromLong(rc);
}

PyDoc_STRVAR(wait_spawn_doc,
	     "wait_spawn() -> None\n\n"
	     "Blocking (the GIL released): check_spawn() once the outcome is known. For callers\n"
	     "without an event loop.");

static PyObject *vm_wait_spawn(VmObject *self, PyObject *unused)
{
	(void)unused;
	if (spawn_result(self, 1) < 0)
		return NULL;
	Py_RETURN_NONE;
}

/* kill + reap + close, with the GIL released for the blocking reap. */
static void vm_do_close(VmObject *self)
{
	struct sbx_vm_remains r;
	int status;
	sbx_vm_begin_close(&self->vm, &r);
	Py_BEGIN_ALLOW_THREADS
	status = sbx_vm_finish_close(&r);
	Py_END_ALLOW_THREADS
	sbx_vm_set_final_status(&self->vm, status);
	sbx_vm_keep_jail(&self->vm, &r);
}

static void vm_dealloc(VmObject *self)
{
	PyTypeObject *tp = Py_TYPE(self);
	vm_do_close(self);
	sbx_vm_destroy(&self->vm);
	Py_CLEAR(self->qemu_binary);
	tp->tp_free((PyObject *)self);
	Py_DECREF(tp);
}

PyDoc_STRVAR(read_events_doc,
	     "read_events() -> list[Event]\n\n"
	     "Non-blocking: read what the channel has now (at most 1 MiB per call) and return\n"
	     "every complete frame as an event: a struct sequence (attributes, and a tuple whose\n"
	     "positions are the fields') whose first field, kind, says what it is:\n"
	     "  ReadyEvent(kind='ready', id, protocol_version, agent_version)\n"
	     "  OutputEvent(kind='stdout' | 'stderr' | 'file_data', id, data)\n"
	     "  ExitEvent(kind='exit', id, exit_code, flags, duration_us)\n"
	     "  ErrorEvent(kind='error' | 'file_error', id, code, message)\n"
	     "  AckEvent(kind='pong' | 'reseeded', id)\n"
	     "  FileDoneEvent(kind='file_done', id, total)\n"
	     "  FileEntriesEvent(kind='file_entries', id, entries: list[FileEntry(name, is_dir,\n"
	     "                   size)])\n"
	     "  ToolCallEvent(kind='tool_call', id, call, name, arguments: bytes)\n"
	     "  OutputChunkEvent(kind='output', id, flags, mime_type, data)  mime_type '' without\n"
	     "                   OUTPUT_BEGIN in flags\n"
	     "  EofEvent(kind='eof')  last, once the other side closed the channel (and on every\n"
	     "                        later call)\n"
	     "A protocol violation raises ProtocolError (errno EPROTO or EMSGSIZE); its .events\n"
	     "lists the events decoded before the violation in the same call. Sticky: every\n"
	     "later call raises it again.");

static PyObject *vm_read_events(VmObject *self, PyObject *unused)
{
	(void)unused;
	return sbx_py_read_events(&self->vm, vm_state(self));
}

/* The requests and flush (py_requests.c). */
static PyObject *vm_send_exec(VmObject *self, PyObject *args, PyObject *kwds)
{
	return sbx_py_send_exec(&self->vm, args, kwds);
}

static PyObject *vm_send_ping(VmObject *self, PyObject *o_id)
{
	return sbx_py_send_ping(&self->vm, o_id);
}

static PyObject *vm_send_prestart(VmObject *self, PyObject *args)
{
	return sbx_py_send_prestart(&self->vm, args);
}

static PyObject *vm_send_reseed(VmObject *self, PyObject *args)
{
	return sbx_py_send_reseed(&self->vm, args);
}

static PyObject *vm_send_file_write_begin(VmObject *self, PyObject *args)
{
	return sbx_py_send_file_write_begin(&self->vm, args);
}

static PyObject *vm_send_file_write_data(VmObject *self, PyObject *args)
{
	return sbx_py_send_file_write_data(&self->vm, args);
}

static PyObject *vm_send_file_write_end(VmObject *self, PyObject *args)
{
	return sbx_py_send_file_write_end(&self->vm, args);
}

static PyObject *vm_send_file_read(VmObject *self, PyObject *args)
{
	return sbx_py_send_file_read(&self->vm, args);
}

static PyObject *vm_send_net_config(VmObject *self, PyObject *args, PyObject *kwds)
{
	return sbx_py_send_net_config(&self->vm, args, kwds);
}

static PyObject *vm_send_file_list(VmObject *self, PyObject *args)
{
	return sbx_py_send_file_list(&self->vm, args);
}

static PyObject *vm_send_tool_result(VmObject *self, PyObject *args)
{
	return sbx_py_send_tool_result(&self->vm, args);
}

static PyObject *vm_send_proc_spawn(VmObject *self, PyObject *args, PyObject *kwds)
{
	return sbx_py_send_proc_spawn(&self->vm, args, kwds);
}

static PyObject *vm_send_proc_read(VmObject *self, PyObject *args)
{
	return sbx_py_send_proc_read(&self->vm, args);
}

static PyObject *vm_send_proc_write(VmObject *self, PyObject *args, PyObject *kwds)
{
	return sbx_py_send_proc_write(&self->vm, args, kwds);
}

static PyObject *vm_send_proc_signal(VmObject *self, PyObject *args)
{
	return sbx_py_send_proc_signal(&self->vm, args);
}

static PyObject *vm_send_proc_wait(VmObject *self, PyObject *args)
{
	return sbx_py_send_proc_wait(&self->vm, args);
}

static PyObject *vm_send_proc_list(VmObject *self, PyObject *o_id)
{
	return sbx_py_send_proc_list(&self->vm, o_id);
}

static PyObject *vm_send_proc_resize(VmObject *self, PyObject *args)
{
	return sbx_py_send_proc_resize(&self->vm, args);
}

static PyObject *vm_flush(VmObject *self, PyObject *unused)
{
	(void)unused;
	return sbx_py_flush(&self->vm);
}

PyDoc_STRVAR(read_console_doc, "read_console() -> bytes\n\nNon-blocking: what the console "
			       "socket has now (at most 64 KiB); b'' if nothing or at EOF.");

static PyObject *vm_read_console(VmObject *self, PyObject *unused)
{
	(void)unused;
	if (check_open(self) < 0)
		return NULL;
	PyObject *buf = PyBytes_FromStringAndSize(NULL, SBX_READ_CONSOLE_MAX);
	if (!buf)
		return NULL;
	struct sbx_err err = {0};
	ssize_t n = sbx_vm_read_console(&self->vm, PyBytes_AS_STRING(buf), SBX_READ_CONSOLE_MAX,
					&err);
	if (n < 0) {
		Py_DECREF(buf);
		return sbx_raise_err(&err, NULL);
	}
	if (_PyBytes_Resize(&buf, n) < 0)
		return NULL;
	return buf;
}

PyDoc_STRVAR(poll_exit_doc,
	     "poll_exit() -> int | None\n\n"
	     "Non-blocking: None while QEMU runs, else its status like subprocess's returncode\n"
	     "(exit code, or -signal). Keeps returning it once reaped, also after close().");

static PyObject *vm_poll_exit(VmObject *self, PyObject *unused)
{
	(void)unused;
	int code;
	struct sbx_err err = {0};
	int rc = sbx_vm_poll_exit(&self->vm, &code, &err);
	if (rc < 0)
		return sbx_raise_err(&err, NULL);
	if (rc == 0)
		Py_RETURN_NONE;
	return PyLong_FromLong(code);
}

PyDoc_STRVAR(kill_doc, "kill() -> None\n\nSIGKILL QEMU. Idempotent; a no-op once reaped or closed.");

static PyObject *vm_kill(VmObject *self, PyObject *unused)
{
	(void)unused;
	struct sbx_err err = {0};
	if (sbx_vm_kill(&self->vm, &err) < 0)
		return sbx_raise_err(&err, NULL);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(close_doc, "close() -> None\n\nSIGKILL QEMU, reap it (blocking, briefly; the GIL is "
			"released) and close every fd. Idempotent.");

static PyObject *vm_close(VmObject *self, PyObject *unused)
{
	(void)unused;
	vm_do_close(self);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(fileno_doc, "fileno() -> int\n\nThe channel socket (for add_reader/add_writer).");

static PyObject *vm_fileno(VmObject *self, PyObject *unused)
{
	(void)unused;
	if (check_open(self) < 0)
		return NULL;
	return PyLong_FromLong(self->vm.ch.fd);
}

PyDoc_STRVAR(jail_status_doc,
	     "jail_status() -> list[tuple[str, bool, str]]\n\n"
	     "(layer, active, detail) for each host jail layer: seccomp, namespaces, cgroup,\n"
	     "rlimits, user. detail says what is in force or why the layer is off. Empty when\n"
	     "the Vm was made with jail=None.");

static PyObject *vm_jail_status(VmObject *self, PyObject *unused)
{
	(void)unused;
	return sbx_py_jail_status(self->vm.jail);
}

PyDoc_STRVAR(resource_usage_doc,
	     "resource_usage() -> tuple[int | None, int | None] | None\n\n"
	     "(cpu_ns, memory_peak_bytes) of QEMU as its cgroup counts them: so far while it runs,\n"
	     "final once the Vm was closed (read just before the cgroup was removed). None without\n"
	     "a cgroup; an item is None when the cgroup had no such counter.");

static PyObject *vm_resource_usage(VmObject *self, PyObject *unused)
{
	(void)unused;
	return sbx_py_resource_usage(self->vm.jail);
}

PyDoc_STRVAR(cgroup_dirs_doc,
	     "cgroup_dirs() -> list[str]\n\nThe directories of QEMU's cgroup while it runs\n"
	     "(one for v2; memory, cpu, cpuacct, pids for v1); [] without one or once closed.");

static PyObject *vm_cgroup_dirs(VmObject *self, PyObject *unused)
{
	(void)unused;
	return sbx_py_cgroup_dirs(self->vm.jail);
}

static PyObject *vm_enter(VmObject *self, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(self);
}

static PyObject *vm_exit(VmObject *self, PyObject *args)
{
	(void)args;
	vm_do_close(self);
	Py_RETURN_FALSE;
}

static PyObject *get_pid(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong((long)self->vm.child.pid);
}

static PyObject *get_pidfd(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->vm.child.pidfd);
}

static PyObject *get_channel_fd(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->vm.ch.fd);
}

static PyObject *get_console_fd(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->vm.console_fd);
}

static PyObject *get_qmp_fd(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->vm.qmp_fd);
}

static PyObject *get_net_fd(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->vm.net_fd);
}

static PyObject *get_spawn_fd(VmObject *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(sbx_vm_spawn_fd(&self->vm));
}

static PyObject *get_closed(VmObject *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->vm.closed);
}

static PyGetSetDef vm_getset[] = {
	{"pid", (getter)get_pid, NULL, "QEMU's pid; -1 once closed", NULL},
	{"pidfd", (getter)get_pidfd, NULL, "a pidfd for QEMU; -1 once closed (or no pidfd support)",
	 NULL},
	{"channel_fd", (getter)get_channel_fd, NULL, "host end of the agent channel; -1 once closed",
	 NULL},
	{"console_fd", (getter)get_console_fd, NULL, "host end of the console; -1 once closed", NULL},
	{"qmp_fd", (getter)get_qmp_fd, NULL,
	 "host end of the QMP socket (O_NONBLOCK); -1 without qmp=True or once closed", NULL},
	{"net_fd", (getter)get_net_fd, NULL,
	 "host end of the network port (O_NONBLOCK, owned and closed by the Vm); -1 without\n"
	 "net_port=True or once closed",
	 NULL},
	{"spawn_fd", (getter)get_spawn_fd, NULL,
	 "readable once QEMU has exec'd or failed to (then call check_spawn()); -1 once known",
	 NULL},
	{"closed", (getter)get_closed, NULL, "True once close() ran", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef vm_methods[] = {
	{"read_events", (PyCFunction)vm_read_events, METH_NOARGS, read_events_doc},
	{"send_exec", (PyCFunction)(void (*)(void))vm_send_exec, METH_VARARGS | METH_KEYWORDS,
	 sbx_py_send_exec_doc},
	{"send_ping", (PyCFunction)vm_send_ping, METH_O, sbx_py_send_ping_doc},
	{"send_reseed", (PyCFunction)vm_send_reseed, METH_VARARGS, sbx_py_send_reseed_doc},
	{"send_prestart", (PyCFunction)vm_send_prestart, METH_VARARGS, sbx_py_send_prestart_doc},
	{"send_file_write_begin", (PyCFunction)vm_send_file_write_begin, METH_VARARGS,
	 sbx_py_send_file_write_begin_doc},
	{"send_file_write_data", (PyCFunction)vm_send_file_write_data, METH_VARARGS,
	 sbx_py_send_file_write_data_doc},
	{"send_file_write_end", (PyCFunction)vm_send_file_write_end, METH_VARARGS,
	 sbx_py_send_file_write_end_doc},
	{"send_file_read", (PyCFunction)vm_send_file_read, METH_VARARGS, sbx_py_send_file_read_doc},
	{"send_net_config", (PyCFunction)(void (*)(void))vm_send_net_config,
	 METH_VARARGS | METH_KEYWORDS,
	 sbx_py_send_net_config_doc},
	{"send_file_list", (PyCFunction)vm_send_file_list, METH_VARARGS, sbx_py_send_file_list_doc},
	{"send_tool_result", (PyCFunction)vm_send_tool_result, METH_VARARGS,
	 sbx_py_send_tool_result_doc},
	{"send_proc_spawn", (PyCFunction)(void (*)(void))vm_send_proc_spawn,
	 METH_VARARGS | METH_KEYWORDS, sbx_py_send_proc_spawn_doc},
	{"send_proc_read", (PyCFunction)vm_send_proc_read, METH_VARARGS, sbx_py_send_proc_read_doc},
	{"send_proc_write", (PyCFunction)(void (*)(void))vm_send_proc_write,
	 METH_VARARGS | METH_KEYWORDS, sbx_py_send_proc_write_doc},
	{"send_proc_signal", (PyCFunction)vm_send_proc_signal, METH_VARARGS,
	 sbx_py_send_proc_signal_doc},
	{"send_proc_wait", (PyCFunction)vm_send_proc_wait, METH_VARARGS, sbx_py_send_proc_wait_doc},
	{"send_proc_list", (PyCFunction)vm_send_proc_list, METH_O, sbx_py_send_proc_list_doc},
	{"send_proc_resize", (PyCFunction)vm_send_proc_resize, METH_VARARGS,
	 sbx_py_send_proc_resize_doc},
	{"flush", (PyCFunction)vm_flush, METH_NOARGS, sbx_py_flush_doc},
	{"read_console", (PyCFunction)vm_read_console, METH_NOARGS, read_console_doc},
	{"check_spawn", (PyCFunction)vm_check_spawn, METH_NOARGS, check_spawn_doc},
	{"wait_spawn", (PyCFunction)vm_wait_spawn, METH_NOARGS, wait_spawn_doc},
	{"poll_exit", (PyCFunction)vm_poll_exit, METH_NOARGS, poll_exit_doc},
	{"kill", (PyCFunction)vm_kill, METH_NOARGS, kill_doc},
	{"close", (PyCFunction)vm_close, METH_NOARGS, close_doc},
	{"fileno", (PyCFunction)vm_fileno, METH_NOARGS, fileno_doc},
	{"jail_status", (PyCFunction)vm_jail_status, METH_NOARGS, jail_status_doc},
	{"resource_usage", (PyCFunction)vm_resource_usage, METH_NOARGS, resource_usage_doc},
	{"cgroup_dirs", (PyCFunction)vm_cgroup_dirs, METH_NOARGS, cgroup_dirs_doc},
	{"__enter__", (PyCFunction)vm_enter, METH_NOARGS, NULL},
	{"__exit__", (PyCFunction)vm_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(vm_doc,
	     "Vm(*, qemu_binary, kernel, rootfs, memory_mb, vcpus=1, accel='tcg',\n"
	     "   kernel_cmdline_extra='', qmp=False, mem_path=None, mem_shared=False,\n"
	     "   incoming=False, qemu_sandbox=False, mem_fd=-1, disks=(), net_port=False,\n"
	     "   jail=None)\n\n"
	     "Start QEMU at once (see build_qemu_argv) with the agent channel at fd 3 and the\n"
	     "console at fds 1, 2 and 4 (and with qmp=True a QMP monitor socket at fd 5, its\n"
	     "host end in .qmp_fd; with mem_fd=N >= 0 a copy of the caller's fd N at fd 6, the\n"
	     "guest RAM's backing file; with net_port=True the network port at fd 7, its host\n"
	     "end in .net_fd). Returns right after the fork: spawn_fd becomes readable\n"
	     "when QEMU has exec'd or failed to, and check_spawn() tells which (wait_spawn()\n"
	     "blocks for it). OSError(errno, '... (from <syscall>)') if it cannot be started,\n"
	     "from here (fork, pipes) or from check_spawn (the child's steps up to execve),\n"
	     "ValueError for an invalid configuration.\n\n"
	     "jail: None, or a dict (every key optional) {'network': 0|1, 'memory_mb',\n"
	     "'cpu_percent', 'pids_max' (cgroup limits, 0 = none), 'uid', 'gid' (-1 = keep),\n"
	     "'groups' (supplementary gids), 'seccomp' ('allow' (default), 'deny', 'log'),\n"
	     "'root' (the paths bound into QEMU's own root)}: QEMU then runs under the host\n"
	     "jail (seccomp, namespaces, root, cgroup, rlimits, user), and the kernel, rootfs\n"
	     "and disks are opened here and passed at fds 8, 9 and 10.. (a writable disk opened\n"
	     "for writing, owned by the jail's uid, RLIMIT_FSIZE its size); see jail_status()\n"
	     "for what the host allowed.\n\n"
	     "QEMU dies with the thread that created the Vm (PR_SET_PDEATHSIG): create it from\n"
	     "a thread that lives as long as the Vm. The fork runs without the GIL.");

static PyType_Slot vm_slots[] = {
	{Py_tp_new, (void *)vm_new},
	{Py_tp_dealloc, (void *)vm_dealloc},
	{Py_tp_methods, vm_methods},
	{Py_tp_getset, vm_getset},
	{Py_tp_doc, (void *)vm_doc},
	{0, NULL},
};

static PyType_Spec vm_spec = {
	.name = "exec_sandbox._execsbx.Vm",
	.basicsize = sizeof(VmObject),
	.itemsize = 0,
	.flags = SBX_PY_TYPE_FLAGS,
	.slots = vm_slots,
};

int sbx_py_vm_type_add(PyObject *module, sbx_module_state *st)
{
	return sbx_py_add_type(module, &vm_spec, &st->vm_type);
}
