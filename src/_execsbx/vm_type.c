/* exec_sandbox._execsbx.Vm: a heap type wrapping struct sbx_vm (vm.h). Every method is
 * non-blocking (the constructor returns right after the fork; spawn_fd tells when the exec
 * happened) except wait_spawn() and close()/dealloc (reaping a SIGKILLed QEMU and removing its
 * cgroup, GIL released: an event loop calls close() once the pidfd is readable, from a thread). Nothing here calls back into Python code. */
#include "binding.h"

#include <errno.h>
#include <string.h>

#include "channel.h"
#include "event.h"
#include "jail.h"
#include "protocol.h"
#include "request.h"
#include "vm.h"

/* Per read_events() call: at most this many bytes are read, so one call stays short even if the
 * guest floods; the fd stays readable and the next call goes on. */
#define SBX_READ_EVENTS_BUDGET (1024u * 1024u)
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
	if (self->vm.closed) {
		PyErr_SetString(PyExc_ValueError, "I/O operation on closed Vm");
		return -1;
	}
	return 0;
}

/* One optional int item of the jail dict; 0 or -1 with an exception set. */
static int jail_int(PyObject *dict, const char *key, long long lo, long long hi, long long *out)
{
	PyObject *v = PyDict_GetItemString(dict, key); /* borrowed */
	if (!v)
		return 0;
	if (!PyLong_Check(v)) {
		PyErr_Format(PyExc_TypeError, "jail['%s'] must be an int", key);
		return -1;
	}
	long long x = PyLong_AsLongLong(v);
	if (x == -1 && PyErr_Occurred())
		return -1;
	if (x < lo || x > hi) {
		PyErr_Format(PyExc_ValueError, "jail['%s'] out of range (%lld .. %lld)", key, lo, hi);
		return -1;
	}
	*out = x;
	return 0;
}

static const char *const jail_keys[] = {"network", "memory_mb", "cpu_percent", "pids_max", "uid",
					"gid", NULL};

/* The jail keyword of Vm(): None (no jail) or a dict with the keys above, all optional. */
static int parse_jail(PyObject *o, struct sbx_jail_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->uid = cfg->gid = -1;
	if (!o || o == Py_None)
		return 0;
	if (!PyDict_Check(o)) {
		PyErr_SetString(PyExc_TypeError, "jail must be a dict or None");
		return -1;
	}
	PyObject *key;
	Py_ssize_t pos = 0;
	while (PyDict_Next(o, &pos, &key, NULL)) {
		int known = 0;
		for (const char *const *k = jail_keys; *k; k++)
			if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, *k) == 0)
				known = 1;
		if (!known) {
			PyErr_Format(PyExc_TypeError, "unknown jail option %R", key);
			return -1;
		}
	}
	long long network = 0, mem = 0, cpu = 0, pids = 0, uid = -1, gid = -1;
	if (jail_int(o, "network", 0, 1, &network) < 0 ||
	    jail_int(o, "memory_mb", 0, 1 << 24, &mem) < 0 ||
	    jail_int(o, "cpu_percent", 0, 100000, &cpu) < 0 ||
	    jail_int(o, "pids_max", 0, 1 << 22, &pids) < 0 ||
	    jail_int(o, "uid", -1, 0x7fffffff, &uid) < 0 ||
	    jail_int(o, "gid", -1, 0x7fffffff, &gid) < 0)
		return -1;
	cfg->enabled = 1;
	cfg->network = (int)network;
	cfg->memory_bytes = (uint64_t)mem << 20;
	cfg->cpu_percent = (unsigned)cpu;
	cfg->pids_max = (unsigned)pids;
	cfg->uid = (long)uid;
	cfg->gid = (long)gid;
	return 0;
}

static PyObject *vm_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	struct sbx_parsed_config pc;
	struct sbx_jail_config jcfg;
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
	int prc = parse_jail(o_jail, &jcfg);
	Py_XDECREF(o_jail);
	if (prc < 0 || sbx_parse_vm_config(args, rest, "Vm", 1, &pc) < 0) {
		Py_DECREF(rest);
		return NULL;
	}
	Py_DECREF(rest);
	char **argv = sbx_build_argv_or_raise(&pc.cfg);
	if (!argv) {
		sbx_parsed_config_release(&pc);
		return NULL;
	}
	VmObject *self = (VmObject *)type->tp_alloc(type, 0);
	if (!self) {
		sbx_argv_free(argv);
		sbx_parsed_config_release(&pc);
		return NULL;
	}
	sbx_vm_init(&self->vm);
	self->qemu_binary = Py_NewRef(pc.qemu_binary);

	/* Returns right after the fork: whether QEMU's exec worked is told by spawn_fd becoming
	 * readable (check_spawn / wait_spawn). The fork stays on the calling thread: PDEATHSIG is
	 * tied to it. */
	const char *where = "spawn";
	int rc = sbx_vm_start(&self->vm, argv, pc.cfg.qmp, pc.mem_fd, pc.cfg.net_port,
			      jcfg.enabled ? &jcfg : NULL,
			      &where);
	sbx_argv_free(argv);
	sbx_parsed_config_release(&pc);
	if (rc < 0) {
		if (!PyErr_Occurred())
			sbx_raise_os_error(-rc, where ? where : "spawn", NULL);
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

/* 1, 0, or -1 with the exception of a start that failed before QEMU's exec. */
static int spawn_result(VmObject *self, int blocking)
{
	const char *where = NULL;
	int rc;
	if (blocking) {
		Py_BEGIN_ALLOW_THREADS
		rc = sbx_vm_start_check(&self->vm, 1, &where);
		Py_END_ALLOW_THREADS
	} else {
		rc = sbx_vm_start_check(&self->vm, 0, &where);
	}
	if (rc >= 0)
		return rc;
	if (rc == -EBADF && !where) {
		PyErr_SetString(PyExc_ValueError, "this Vm's start is no longer known (closed)");
		return -1;
	}
	PyObject *filename = NULL;
	if (where && strcmp(where, "execve") == 0)
		filename = PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(self->qemu_binary),
							    PyBytes_GET_SIZE(self->qemu_binary));
	if (!PyErr_Occurred())
		sbx_raise_os_error(-rc, where ? where : "spawn", filename);
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

/* Raise ProtocolError(errno, message); its .events holds the events decoded before the
 * violation in the same read_events() call (a list; new reference stolen, may be NULL). */
static PyObject *protocol_error(VmObject *self, PyObject *events)
{
	const struct sbx_channel *ch = &self->vm.ch;
	PyObject *msg;
	if (ch->error_frame_type < 0)
		msg = PyUnicode_FromString(ch->error == -EMSGSIZE
						   ? "guest sent a frame larger than GUEST_FRAME_MAX"
						   : "guest sent a malformed frame header");
	else if ((ch->error_frame_type >= SBX_MSG_READY &&
		  ch->error_frame_type <= SBX_MSG_FILE_ERROR) ||
		 ch->error_frame_type == SBX_MSG_RESEEDED)
		msg = PyUnicode_FromFormat(
			"guest sent a malformed %s frame%s",
			sbx_event_kind_name((enum sbx_event_kind)ch->error_frame_type),
			ch->error == -EMSGSIZE ? " (a string over its limit)" : "");
	else
		msg = PyUnicode_FromFormat("guest sent a frame of unexpected type %d",
					   ch->error_frame_type);
	if (!msg) {
		Py_XDECREF(events);
		return NULL;
	}
	PyObject *exc = PyObject_CallFunction(vm_state(self)->protocol_error, "iN", -ch->error, msg);
	if (!events)
		events = PyList_New(0);
	if (exc && events && PyObject_SetAttrString(exc, "events", events) == 0)
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
	Py_XDECREF(exc);
	Py_XDECREF(events);
	return NULL;
}

static PyObject *decode_text(const struct sbx_event *ev)
{
	return PyUnicode_DecodeUTF8((const char *)ev->data, (Py_ssize_t)ev->len, "replace");
}

/* ('file_entries', id, [(name: bytes, is_dir: bool, size: int), ...]); the decoder validated
 * every entry. */
static PyObject *entries_to_tuple(const struct sbx_event *ev)
{
	PyObject *list = PyList_New((Py_ssize_t)ev->count);
	if (!list)
		return NULL;
	struct sbx_cursor c = {ev->data, ev->len};
	for (uint32_t i = 0; i < ev->count; i++) {
		struct sbx_dir_entry e;
		if (sbx_dir_entry_next(&c, &e) < 0) {
			Py_DECREF(list);
			PyErr_SetString(PyExc_SystemError, "undecodable entry after validation");
			return NULL;
		}
		PyObject *item = Py_BuildValue("(y#NK)", (const char *)e.name, (Py_ssize_t)e.name_len,
					       PyBool_FromLong(e.is_dir), (unsigned long long)e.size);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
	return Py_BuildValue("(skN)", "file_entries", (unsigned long)ev->id, list);
}

static PyObject *event_to_tuple(const struct sbx_event *ev)
{
	switch (ev->kind) {
	case SBX_EV_READY:
		return Py_BuildValue("(skkN)", "ready", (unsigned long)ev->id,
				     (unsigned long)ev->protocol_version, decode_text(ev));
	case SBX_EV_STDOUT:
	case SBX_EV_STDERR:
		return Py_BuildValue("(sky#)", sbx_event_kind_name(ev->kind), (unsigned long)ev->id,
				     (const char *)ev->data, (Py_ssize_t)ev->len);
	case SBX_EV_EXIT:
		return Py_BuildValue("(skikK)", "exit", (unsigned long)ev->id, (int)ev->exit.exit_code,
				     (unsigned long)ev->exit.flags,
				     (unsigned long long)ev->exit.duration_us);
	case SBX_EV_ERROR:
		return Py_BuildValue("(skkN)", "error", (unsigned long)ev->id,
				     (unsigned long)ev->error_code, decode_text(ev));
	case SBX_EV_PONG:
		return Py_BuildValue("(sk)", "pong", (unsigned long)ev->id);
	case SBX_EV_FILE_DATA:
		return Py_BuildValue("(sky#)", "file_data", (unsigned long)ev->id,
				     (const char *)ev->data, (Py_ssize_t)ev->len);
	case SBX_EV_FILE_ENTRIES:
		return entries_to_tuple(ev);
	case SBX_EV_FILE_DONE:
		return Py_BuildValue("(skK)", "file_done", (unsigned long)ev->id,
				     (unsigned long long)ev->value);
	case SBX_EV_FILE_ERROR:
		return Py_BuildValue("(skkN)", "file_error", (unsigned long)ev->id,
				     (unsigned long)ev->error_code, decode_text(ev));
	case SBX_EV_RESEEDED:
		return Py_BuildValue("(sk)", "reseeded", (unsigned long)ev->id);
	}
	PyErr_SetString(PyExc_SystemError, "unknown event kind");
	return NULL;
}

static int append_new(PyObject *list, PyObject *item)
{
	if (!item)
		return -1;
	int rc = PyList_Append(list, item);
	Py_DECREF(item);
	return rc;
}

PyDoc_STRVAR(read_events_doc,
	     "read_events() -> list[tuple]\n\n"
	     "Non-blocking: read what the channel has now (at most 1 MiB per call) and return\n"
	     "every complete frame as an event tuple:\n"
	     "  ('ready', id, protocol_version, agent_version)\n"
	     "  ('stdout', id, data) / ('stderr', id, data)\n"
	     "  ('exit', id, exit_code, flags, duration_us)\n"
	     "  ('error', id, code, message)\n"
	     "  ('pong', id)\n"
	     "  ('file_data', id, data) / ('file_done', id, n) / ('file_error', id, code, message)\n"
	     "  ('file_entries', id, [(name: bytes, is_dir, size), ...])\n"
	     "  ('reseeded', id)\n"
	     "  ('eof',)  last, once the other side closed the channel (and on every later call)\n"
	     "A protocol violation raises ProtocolError (errno EPROTO or EMSGSIZE); its .events\n"
	     "lists the events decoded before the violation in the same call. Sticky: every\n"
	     "later call raises it again.");

static PyObject *vm_read_events(VmObject *self, PyObject *unused)
{
	(void)unused;
	struct sbx_channel *ch = &self->vm.ch;
	if (check_open(self) < 0)
		return NULL;
	if (ch->error)
		return protocol_error(self, NULL);
	PyObject *list = PyList_New(0);
	if (!list)
		return NULL;
	size_t budget = SBX_READ_EVENTS_BUDGET;
	for (;;) {
		struct sbx_event ev;
		int rc;
		/* Drain before every read: the decoder holds at most two maximal frames. */
		while ((rc = sbx_channel_next_event(ch, &ev)) == 1)
			if (append_new(list, event_to_tuple(&ev)) < 0)
				goto fail;
		if (rc < 0) /* raise now: the fd may never be readable again to report it later */
			return protocol_error(self, list);
		if (ch->eof) {
			if (append_new(list, Py_BuildValue("(s)", "eof")) < 0)
				goto fail;
			break;
		}
		if (budget == 0)
			break;
		ssize_t n = sbx_channel_read(ch, budget);
		if (n < 0) {
			if (ch->error)
				continue; /* reported by sbx_channel_next_event above */
			if (n == -ENOMEM) {
				PyErr_NoMemory();
				goto fail;
			}
			sbx_raise_os_error((int)-n, "recv", NULL);
			goto fail;
		}
		if (n == 0 && !ch->eof)
			break; /* nothing more now */
		budget -= (size_t)n;
	}
	return list;
fail:
	Py_DECREF(list);
	return NULL;
}

/* A Python int in 0 .. 2**32-1; ValueError otherwise. */
static int to_u32(PyObject *o, const char *name, uint32_t *out)
{
	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be an int", name);
		return -1;
	}
	int overflow;
	long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
	if (v == -1 && PyErr_Occurred())
		return -1;
	if (overflow || v < 0 || v > (long long)UINT32_MAX) {
		PyErr_Format(PyExc_ValueError, "%s must be in 0 .. 2**32-1", name);
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* Turn a queueing/flush result into the return value (bytes still pending) or an exception. */
static PyObject *pending_or_raise(VmObject *self, int rc, const char *why, const char *where)
{
	if (rc == -EINVAL || rc == -EMSGSIZE) {
		PyErr_SetString(PyExc_ValueError, why ? why : "invalid request");
		return NULL;
	}
	if (rc == -ENOMEM)
		return PyErr_NoMemory();
	if (rc < 0)
		return sbx_raise_os_error(-rc, where, NULL);
	return PyLong_FromSize_t(sbx_channel_pending(&self->vm.ch));
}

PyDoc_STRVAR(send_exec_doc,
	     "send_exec(id, language, timeout_ms, stdout_limit, stderr_limit, env, code,\n"
	     "          session=False) -> int\n\n"
	     "session=True sends SESSION_EXEC: the code runs in the VM's persistent REPL.\n"
	     "Queue an EXEC frame and write what the socket takes now; returns the bytes still\n"
	     "pending (call flush() when fileno() is writable until it returns 0).\n"
	     "env: list of (name: bytes, value: bytes); code: bytes-like.\n"
	     "ValueError for a request over the protocol limits; OSError for a write error\n"
	     "(e.g. BrokenPipeError once QEMU is gone; the frame stays queued).");

static PyObject *vm_send_exec(VmObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"id", "language", "timeout_ms", "stdout_limit", "stderr_limit",
				 "env", "code", "session", NULL};
	PyObject *o_id, *o_lang, *o_timeout, *o_out, *o_err, *o_env;
	Py_buffer code;
	struct sbx_exec_req req = {0};
	struct sbx_env_var *vars = NULL;
	PyObject *seq = NULL, *result = NULL;

	int session = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOy*|p:send_exec", kwlist, &o_id, &o_lang,
					 &o_timeout, &o_out, &o_err, &o_env, &code, &session))
		return NULL;
	if (check_open(self) < 0)
		goto out;
	if (to_u32(o_id, "id", &req.id) < 0 || to_u32(o_lang, "language", &req.language) < 0 ||
	    to_u32(o_timeout, "timeout_ms", &req.timeout_ms) < 0 ||
	    to_u32(o_out, "stdout_limit", &req.stdout_limit) < 0 ||
	    to_u32(o_err, "stderr_limit", &req.stderr_limit) < 0)
		goto out;
	seq = PySequence_Fast(o_env, "env must be a sequence of (bytes, bytes) pairs");
	if (!seq)
		goto out;
	Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
	if (count > (Py_ssize_t)SBX_ENV_MAX_COUNT) {
		PyErr_SetString(PyExc_ValueError, "more than 100 environment variables");
		goto out;
	}
	vars = PyMem_Calloc(count ? (size_t)count : 1, sizeof(*vars));
	if (!vars) {
		PyErr_NoMemory();
		goto out;
	}
	/* Borrowed references: seq owns the items, the items own their bytes, and the GIL is held
	 * until encoding is done. */
	for (Py_ssize_t i = 0; i < count; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
		if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
		    !PyBytes_Check(PyTuple_GET_ITEM(item, 0)) ||
		    !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
			PyErr_SetString(PyExc_TypeError, "env items must be (bytes, bytes) tuples");
			goto out;
		}
		PyObject *name = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
		vars[i].name = (const uint8_t *)PyBytes_AS_STRING(name);
		vars[i].name_len = (size_t)PyBytes_GET_SIZE(name);
		vars[i].value = (const uint8_t *)PyBytes_AS_STRING(value);
		vars[i].value_len = (size_t)PyBytes_GET_SIZE(value);
	}
	req.env = vars;
	req.env_count = (size_t)count;
	req.code = code.buf;
	req.code_len = (size_t)code.len;
	req.session = session;
	const char *why = NULL;
	int rc = sbx_channel_queue_exec(&self->vm.ch, &req, &why);
	result = pending_or_raise(self, rc, why, rc == -ENOBUFS ? "send_exec" : "send");
out:
	PyMem_Free(vars);
	Py_XDECREF(seq);
	PyBuffer_Release(&code);
	return result;
}

PyDoc_STRVAR(send_ping_doc, "send_ping(id) -> int\n\nQueue a PING frame and try to write; "
			    "returns the bytes still pending.");

static PyObject *vm_send_ping(VmObject *self, PyObject *o_id)
{
	uint32_t id;
	if (check_open(self) < 0 || to_u32(o_id, "id", &id) < 0)
		return NULL;
	int rc = sbx_channel_queue_ping(&self->vm.ch, id);
	return pending_or_raise(self, rc, "PING frame", rc == -ENOBUFS ? "send_ping" : "send");
}

PyDoc_STRVAR(send_prestart_doc,
	     "send_prestart(id, language) -> int\n\n"
	     "Queue a PRESTART frame (language: LANG_PYTHON or LANG_JAVASCRIPT) and try to write;\n"
	     "returns the bytes still pending. The guest answers ('pong', id) once the interpreter\n"
	     "waits for the next EXEC, or ('error', id, code, message).");

static PyObject *vm_send_prestart(VmObject *self, PyObject *args)
{
	PyObject *o_id;
	unsigned char language;
	uint32_t id;
	if (!PyArg_ParseTuple(args, "Ob:send_prestart", &o_id, &language))
		return NULL;
	if (check_open(self) < 0 || to_u32(o_id, "id", &id) < 0)
		return NULL;
	int rc = sbx_channel_queue_prestart(&self->vm.ch, id, language);
	if (rc == -EINVAL) {
		PyErr_Format(PyExc_ValueError, "unknown language %u", language);
		return NULL;
	}
	return pending_or_raise(self, rc, "PRESTART frame",
				rc == -ENOBUFS ? "send_prestart" : "send");
}

PyDoc_STRVAR(send_reseed_doc,
	     "send_reseed(id, seed, realtime_ns=0) -> int\n\n"
	     "Queue a RESEED frame carrying seed (exactly RESEED_BYTES bytes from the host's CSPRNG)\n"
	     "and the host's wall clock in ns (0: leave the guest clock alone), and try to write;\n"
	     "returns the bytes still pending. The guest answers ('reseeded', id).");

static PyObject *vm_send_reseed(VmObject *self, PyObject *args)
{
	PyObject *o_id;
	Py_buffer seed;
	uint32_t id;
	unsigned long long realtime_ns = 0;
	if (!PyArg_ParseTuple(args, "Oy*|K:send_reseed", &o_id, &seed, &realtime_ns))
		return NULL;
	PyObject *result = NULL;
	if (check_open(self) < 0 || to_u32(o_id, "id", &id) < 0)
		goto out;
	if (seed.len != (Py_ssize_t)SBX_RESEED_BYTES) {
		PyErr_Format(PyExc_ValueError, "seed must be %u bytes", SBX_RESEED_BYTES);
		goto out;
	}
	int rc = sbx_channel_queue_reseed(&self->vm.ch, id, seed.buf, (size_t)seed.len,
					  (uint64_t)realtime_ns);
	result = pending_or_raise(self, rc, "RESEED frame", rc == -ENOBUFS ? "send_reseed" : "send");
out:
	PyBuffer_Release(&seed);
	return result;
}

PyDoc_STRVAR(send_file_frame_doc,
	     "send_file_frame(type, id, payload) -> int\n\n"
	     "Queue one file-transfer frame (MSG_FILE_WRITE_BEGIN .. MSG_FILE_LIST) with a payload\n"
	     "built by the caller; returns the bytes still pending. ValueError for another type\n"
	     "or a payload over HOST_FRAME_MAX; BufferError (ENOBUFS as OSError) when the queue\n"
	     "is full: wait for flush() to return 0 before sending more.");

static PyObject *vm_send_file_frame(VmObject *self, PyObject *args)
{
	PyObject *o_type, *o_id;
	Py_buffer payload;
	uint32_t type, id;
	if (!PyArg_ParseTuple(args, "OOy*:send_file_frame", &o_type, &o_id, &payload))
		return NULL;
	PyObject *result = NULL;
	if (check_open(self) < 0 || to_u32(o_type, "type", &type) < 0 || to_u32(o_id, "id", &id) < 0)
		goto out;
	if (type > 255) {
		PyErr_SetString(PyExc_ValueError, "not a file-transfer message type");
		goto out;
	}
	int rc = sbx_channel_queue_file_frame(&self->vm.ch, (uint8_t)type, id, payload.buf,
					      (size_t)payload.len);
	result = pending_or_raise(self, rc,
				  rc == -EINVAL ? "not a file-transfer message type"
						: "payload larger than HOST_FRAME_MAX",
				  rc == -ENOBUFS ? "send_file_frame" : "send");
out:
	PyBuffer_Release(&payload);
	return result;
}

PyDoc_STRVAR(flush_doc, "flush() -> int\n\nWrite pending bytes as far as the socket takes them "
			"now; returns the bytes still pending.");

static PyObject *vm_flush(VmObject *self, PyObject *unused)
{
	(void)unused;
	if (check_open(self) < 0)
		return NULL;
	return pending_or_raise(self, sbx_channel_flush(&self->vm.ch), NULL, "send");
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
	ssize_t n = sbx_vm_read_console(&self->vm, PyBytes_AS_STRING(buf), SBX_READ_CONSOLE_MAX);
	if (n < 0) {
		Py_DECREF(buf);
		return sbx_raise_os_error((int)-n, "recv", NULL);
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
	int rc = sbx_vm_poll_exit(&self->vm, &code);
	if (rc < 0)
		return sbx_raise_os_error(-rc, "waitid", NULL);
	if (rc == 0)
		Py_RETURN_NONE;
	return PyLong_FromLong(code);
}

PyDoc_STRVAR(kill_doc, "kill() -> None\n\nSIGKILL QEMU. Idempotent; a no-op once reaped or closed.");

static PyObject *vm_kill(VmObject *self, PyObject *unused)
{
	(void)unused;
	int rc = sbx_vm_kill(&self->vm);
	if (rc < 0)
		return sbx_raise_os_error(-rc, "pidfd_send_signal", NULL);
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
	const struct sbx_jail *j = self->vm.jail;
	PyObject *list = PyList_New(0);
	if (!list || !j)
		return list;
	for (int l = 0; l < SBX_LAYER__COUNT; l++)
		if (append_new(list, Py_BuildValue("(sNs)", sbx_layer_names[l],
						   PyBool_FromLong(j->status[l].active),
						   j->status[l].detail)) < 0) {
			Py_DECREF(list);
			return NULL;
		}
	return list;
}

PyDoc_STRVAR(resource_usage_doc,
	     "resource_usage() -> tuple[int | None, int | None] | None\n\n"
	     "(cpu_ns, memory_peak_bytes) of QEMU as its cgroup counts them: so far while it runs,\n"
	     "final once the Vm was closed (read just before the cgroup was removed). None without\n"
	     "a cgroup; an item is None when the cgroup had no such counter.");

static PyObject *u64_or_none(uint64_t v)
{
	if (v == UINT64_MAX)
		Py_RETURN_NONE;
	return PyLong_FromUnsignedLongLong(v);
}

static PyObject *vm_resource_usage(VmObject *self, PyObject *unused)
{
	(void)unused;
	const struct sbx_jail *j = self->vm.jail;
	if (!j)
		Py_RETURN_NONE;
	if (j->usage_valid)
		return Py_BuildValue("(NN)", u64_or_none(j->cpu_ns), u64_or_none(j->memory_peak));
	if (!j->cg.version || j->cgroup_failed)
		Py_RETURN_NONE;
	/* Still running: the figures so far (a few small file reads, which can wait on cgroupfs
	 * locks for milliseconds: the GIL is released, and an event loop calls this from a
	 * thread). */
	uint64_t cpu_ns, memory_peak;
	Py_BEGIN_ALLOW_THREADS
	sbx_cgroup_usage(&j->cg, &cpu_ns, &memory_peak);
	Py_END_ALLOW_THREADS
	return Py_BuildValue("(NN)", u64_or_none(cpu_ns), u64_or_none(memory_peak));
}

PyDoc_STRVAR(cgroup_dirs_doc,
	     "cgroup_dirs() -> list[str]\n\nThe directories of QEMU's cgroup while it runs\n"
	     "(one for v2; memory, cpu, cpuacct, pids for v1); [] without one or once closed.");

static PyObject *vm_cgroup_dirs(VmObject *self, PyObject *unused)
{
	(void)unused;
	const struct sbx_jail *j = self->vm.jail;
	PyObject *list = PyList_New(0);
	if (!list || !j || j->cgroup_failed)
		return list;
	for (unsigned i = 0; i < j->cg.ndirs; i++)
		if (append_new(list, PyUnicode_DecodeFSDefault(j->cg.dirs[i])) < 0) {
			Py_DECREF(list);
			return NULL;
		}
	return list;
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
	 send_exec_doc},
	{"send_ping", (PyCFunction)vm_send_ping, METH_O, send_ping_doc},
	{"send_reseed", (PyCFunction)vm_send_reseed, METH_VARARGS, send_reseed_doc},
	{"send_prestart", (PyCFunction)vm_send_prestart, METH_VARARGS, send_prestart_doc},
	{"send_file_frame", (PyCFunction)vm_send_file_frame, METH_VARARGS, send_file_frame_doc},
	{"flush", (PyCFunction)vm_flush, METH_NOARGS, flush_doc},
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
	     "   incoming=False, qemu_sandbox=False, mem_fd=-1, layer=None, layer_kind=None,\n"
	     "   net_port=False, jail=None)\n\n"
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
	     "'cpu_percent', 'pids_max' (cgroup limits, 0 = none), 'uid', 'gid' (-1 = keep)}:\n"
	     "QEMU then runs under the host jail (seccomp, namespaces, cgroup, rlimits, user);\n"
	     "see jail_status() for what the host allowed.\n\n"
	     "QEMU dies with the thread that created the Vm (PR_SET_PDEATHSIG): create it from\n"
	     "a thread that lives as long as the Vm (e.g. the event loop's).");

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
#ifdef Py_TPFLAGS_IMMUTABLETYPE
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
#else
	.flags = Py_TPFLAGS_DEFAULT,
#endif
	.slots = vm_slots,
};

int sbx_vm_type_add(PyObject *module, sbx_module_state *st)
{
	st->vm_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &vm_spec, NULL);
	if (!st->vm_type)
		return -1;
	return PyModule_AddType(module, st->vm_type);
}
