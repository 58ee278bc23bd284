/* Vm.send_*() and flush(): Python arguments -> host->guest frames (agent_request.h) queued on
 * the VM's channel. Each returns the bytes still pending, or NULL with ValueError (a request over
 * the protocol's limits), MemoryError or OSError (a write error) set. */
#include "py_requests.h"

#include <errno.h>
#include <stdint.h>

#include "protocol.h"
#include "py_errors.h"

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
static PyObject *pending_or_raise(struct sbx_vm *vm, int rc, const struct sbx_err *e)
{
	if (rc < 0)
		return sbx_raise_err(e, NULL);
	return PyLong_FromSize_t(sbx_channel_pending(&vm->ch));
}

/* env: a sequence of (bytes, bytes) -> *vars (PyMem_Free it) pointing into *seq's items
 * (Py_XDECREF it after encoding; the GIL is held until then). 0 or -1 with an exception. */
static int env_vars(PyObject *o_env, PyObject **seq, struct sbx_env_var **vars, Py_ssize_t *n)
{
	*seq = PySequence_Fast(o_env, "env must be a sequence of (bytes, bytes) pairs");
	if (!*seq)
		return -1;
	Py_ssize_t count = PySequence_Fast_GET_SIZE(*seq);
	if (count > (Py_ssize_t)SBX_ENV_MAX_COUNT) {
		PyErr_SetString(PyExc_ValueError, "more than 100 environment variables");
		return -1;
	}
	*vars = PyMem_Calloc(count ? (size_t)count : 1, sizeof(**vars));
	if (!*vars) {
		PyErr_NoMemory();
		return -1;
	}
	/* Borrowed references: seq owns the items, the items own their bytes. */
	for (Py_ssize_t i = 0; i < count; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(*seq, i);
		if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
		    !PyBytes_Check(PyTuple_GET_ITEM(item, 0)) ||
		    !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
			PyErr_SetString(PyExc_TypeError, "env items must be (bytes, bytes) tuples");
			return -1;
		}
		PyObject *name = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
		(*vars)[i].name = (const uint8_t *)PyBytes_AS_STRING(name);
		(*vars)[i].name_len = (size_t)PyBytes_GET_SIZE(name);
		(*vars)[i].value = (const uint8_t *)PyBytes_AS_STRING(value);
		(*vars)[i].value_len = (size_t)PyBytes_GET_SIZE(value);
	}
	*n = count;
	return 0;
}

const char sbx_py_send_exec_doc[] =
	     "send_exec(id, language, timeout_ms, stdout_limit, stderr_limit, env, code,\n"
	     "          session=False) -> int\n\n"
	     "session=True sends SESSION_EXEC: the code runs in the VM's persistent REPL.\n"
	     "Queue an EXEC frame and write what the socket takes now; returns the bytes still\n"
	     "pending (call flush() when fileno() is writable until it returns 0).\n"
	     "env: list of (name: bytes, value: bytes); code: bytes-like.\n"
	     "ValueError for a request over the protocol limits; OSError for a write error\n"
	     "(e.g. BrokenPipeError once QEMU is gone; the frame stays queued).";

PyObject *sbx_py_send_exec(struct sbx_vm *vm, PyObject *args, PyObject *kwds)
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
	if (sbx_raise_if_closed(vm->closed) < 0)
		goto out;
	if (to_u32(o_id, "id", &req.id) < 0 || to_u32(o_lang, "language", &req.language) < 0 ||
	    to_u32(o_timeout, "timeout_ms", &req.timeout_ms) < 0 ||
	    to_u32(o_out, "stdout_limit", &req.stdout_limit) < 0 ||
	    to_u32(o_err, "stderr_limit", &req.stderr_limit) < 0)
		goto out;
	Py_ssize_t count;
	if (env_vars(o_env, &seq, &vars, &count) < 0)
		goto out;
	req.env = vars;
	req.env_count = (size_t)count;
	req.code = code.buf;
	req.code_len = (size_t)code.len;
	req.session = session;
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_exec(&vm->ch, &req, &err);
	result = pending_or_raise(vm, rc, &err);
out:
	PyMem_Free(vars);
	Py_XDECREF(seq);
	PyBuffer_Release(&code);
	return result;
}

const char sbx_py_send_ping_doc[] = "send_ping(id) -> int\n\nQueue a PING frame and try to write; "
			    "returns the bytes still pending.";

PyObject *sbx_py_send_ping(struct sbx_vm *vm, PyObject *o_id)
{
	uint32_t id;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &id) < 0)
		return NULL;
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_ping(&vm->ch, id, &err);
	return pending_or_raise(vm, rc, &err);
}

const char sbx_py_send_prestart_doc[] =
	     "send_prestart(id, language) -> int\n\n"
	     "Queue a PRESTART frame (language: LANG_PYTHON or LANG_JAVASCRIPT) and try to write;\n"
	     "returns the bytes still pending. The guest answers ('pong', id) once the interpreter\n"
	     "waits for the next EXEC, or ('error', id, code, message).";

PyObject *sbx_py_send_prestart(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id;
	unsigned char language;
	uint32_t id;
	if (!PyArg_ParseTuple(args, "Ob:send_prestart", &o_id, &language))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &id) < 0)
		return NULL;
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_prestart(&vm->ch, id, language, &err);
	return pending_or_raise(vm, rc, &err);
}

const char sbx_py_send_reseed_doc[] =
	     "send_reseed(id, seed, realtime_ns=0) -> int\n\n"
	     "Queue a RESEED frame carrying seed (exactly RESEED_BYTES bytes from the host's CSPRNG)\n"
	     "and the host's wall clock in ns (0: leave the guest clock alone), and try to write;\n"
	     "returns the bytes still pending. The guest answers ('reseeded', id).";

PyObject *sbx_py_send_reseed(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id;
	Py_buffer seed;
	uint32_t id;
	unsigned long long realtime_ns = 0;
	if (!PyArg_ParseTuple(args, "Oy*|K:send_reseed", &o_id, &seed, &realtime_ns))
		return NULL;
	PyObject *result = NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &id) < 0)
		goto out;
	if (seed.len != (Py_ssize_t)SBX_RESEED_BYTES) {
		PyErr_Format(PyExc_ValueError, "seed must be %u bytes", SBX_RESEED_BYTES);
		goto out;
	}
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_reseed(&vm->ch, id, seed.buf, (size_t)seed.len,
					  (uint64_t)realtime_ns, &err);
	result = pending_or_raise(vm, rc, &err);
out:
	PyBuffer_Release(&seed);
	return result;
}

/* Queue one file request (agent_request.h). */
static PyObject *queue_file(struct sbx_vm *vm, const struct sbx_file_req *r)
{
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_file(&vm->ch, r, &err);
	return pending_or_raise(vm, rc, &err);
}

#define FILE_SEND_NOTE                                                                         \
	"Returns the bytes still pending. ValueError for a request over the protocol's limits;\n" \
	"OSError(ENOBUFS) when the queue is full: wait for flush() to return 0 before sending\n"  \
	"more."

const char sbx_py_send_file_write_begin_doc[] =
	"send_file_write_begin(id, path, flags) -> int\n\n"
	"Queue FILE_WRITE_BEGIN: path (bytes, relative to the guest home, at most PATH_MAX) is\n"
	"written to a temporary file, mode 0755 with FILE_EXECUTABLE in flags else 0644; with\n"
	"FILE_NODE_SNAPSHOT alone and path b'', the file is node's startup snapshot instead.\n"
	"FILE_WRITE_DATA and FILE_WRITE_END follow with the same id. " FILE_SEND_NOTE;

/* FILE_WRITE_BEGIN and FILE_READ: a path and FILE_* flags. */
static PyObject *send_file_target(struct sbx_vm *vm, PyObject *args, uint8_t type,
				  const char *fmt)
{
	PyObject *o_id, *result = NULL;
	Py_buffer path;
	unsigned int flags = 0;
	struct sbx_file_req r = {.type = type};
	if (!PyArg_ParseTuple(args, fmt, &o_id, &path, &flags))
		return NULL;
	if (flags > 0xff) {
		PyErr_SetString(PyExc_ValueError, "unknown file flag");
	} else if (sbx_raise_if_closed(vm->closed) == 0 && to_u32(o_id, "id", &r.id) == 0) {
		r.path = path.buf;
		r.path_len = (size_t)path.len;
		r.flag = (uint8_t)flags;
		result = queue_file(vm, &r);
	}
	PyBuffer_Release(&path);
	return result;
}

PyObject *sbx_py_send_file_write_begin(struct sbx_vm *vm, PyObject *args)
{
	return send_file_target(vm, args, SBX_MSG_FILE_WRITE_BEGIN, "Oy*I:send_file_write_begin");
}

const char sbx_py_send_file_write_data_doc[] =
	"send_file_write_data(id, data) -> int\n\n"
	"Queue FILE_WRITE_DATA: the next bytes (bytes-like, at most HOST_FRAME_MAX) of the\n"
	"write started with send_file_write_begin(id, ...). " FILE_SEND_NOTE;

PyObject *sbx_py_send_file_write_data(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id, *result = NULL;
	Py_buffer data;
	struct sbx_file_req r = {.type = SBX_MSG_FILE_WRITE_DATA};
	if (!PyArg_ParseTuple(args, "Oy*:send_file_write_data", &o_id, &data))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) == 0 && to_u32(o_id, "id", &r.id) == 0) {
		r.data = data.buf;
		r.data_len = (size_t)data.len;
		result = queue_file(vm, &r);
	}
	PyBuffer_Release(&data);
	return result;
}

const char sbx_py_send_file_write_end_doc[] =
	"send_file_write_end(id, commit) -> int\n\n"
	"Queue FILE_WRITE_END: commit=True renames the temporary file into place (answered by\n"
	"FILE_DONE or FILE_ERROR), False drops it (no answer). " FILE_SEND_NOTE;

PyObject *sbx_py_send_file_write_end(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id;
	int commit;
	struct sbx_file_req r = {.type = SBX_MSG_FILE_WRITE_END};
	if (!PyArg_ParseTuple(args, "Op:send_file_write_end", &o_id, &commit))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0)
		return NULL;
	r.flag = commit ? 1 : 0;
	return queue_file(vm, &r);
}

/* FILE_LIST: a path and nothing else. */
static PyObject *send_file_path(struct sbx_vm *vm, PyObject *args, uint8_t type, const char *fmt)
{
	PyObject *o_id, *result = NULL;
	Py_buffer path;
	struct sbx_file_req r = {.type = type};
	if (!PyArg_ParseTuple(args, fmt, &o_id, &path))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) == 0 && to_u32(o_id, "id", &r.id) == 0) {
		r.path = path.buf;
		r.path_len = (size_t)path.len;
		result = queue_file(vm, &r);
	}
	PyBuffer_Release(&path);
	return result;
}

const char sbx_py_send_file_read_doc[] =
	"send_file_read(id, path, flags=0) -> int\n\n"
	"Queue FILE_READ of path (bytes, relative to the guest home; with flags\n"
	"FILE_NODE_SNAPSHOT and path b'', node's startup snapshot after the guest's CPU tag):\n"
	"answered by FILE_DATA events, then FILE_DONE (the byte count) or FILE_ERROR. "
	FILE_SEND_NOTE;

PyObject *sbx_py_send_file_read(struct sbx_vm *vm, PyObject *args)
{
	return send_file_target(vm, args, SBX_MSG_FILE_READ, "Oy*|I:send_file_read");
}

const char sbx_py_send_file_list_doc[] =
	"send_file_list(id, path) -> int\n\n"
	"Queue FILE_LIST of the directory path (bytes, relative to the guest home; b'' for the\n"
	"home): answered by FILE_ENTRIES events, then FILE_DONE (the entry count) or\n"
	"FILE_ERROR. " FILE_SEND_NOTE;

PyObject *sbx_py_send_file_list(struct sbx_vm *vm, PyObject *args)
{
	return send_file_path(vm, args, SBX_MSG_FILE_LIST, "Oy*:send_file_list");
}

const char sbx_py_send_net_config_doc[] =
	"send_net_config(id, outbound, names, ports, ca_bundle, reattach=False) -> int\n\n"
	"Queue NET_CONFIG (net_protocol.h), encoded here from the values the network policy chose\n"
	"(exec_sandbox/network/config_frame.py): outbound (bool: allow_network), names (sequence\n"
	"of str: lowercase DNS names, or '*' alone for every name), ports (sequence of int: extra\n"
	"outbound ports), ca_bundle (bytes, PEM; b'': the image's), reattach (a VM restored from a\n"
	"state saved with network: the guest resets its old streams). Answered by an ACK (PONG) or\n"
	"ERROR. Returns the bytes still pending; ValueError for values the protocol refuses (over\n"
	"its limits, a malformed name or port, a NUL in the bundle).";

PyObject *sbx_py_send_net_config(struct sbx_vm *vm, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"id", "outbound", "names", "ports", "ca_bundle", "reattach", NULL};
	PyObject *o_id, *o_names, *o_ports, *names = NULL, *ports = NULL, *result = NULL;
	int outbound, reattach = 0;
	Py_buffer ca;
	struct sbx_bytes *nv = NULL;
	uint32_t *pv = NULL;
	struct sbx_net_config_req req = {0};
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OpOOy*|p:send_net_config", kwlist,
					 &o_id, &outbound, &o_names, &o_ports, &ca, &reattach))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &req.id) < 0)
		goto out;
	names = PySequence_Fast(o_names, "names must be a sequence of str");
	ports = names ? PySequence_Fast(o_ports, "ports must be a sequence of int") : NULL;
	if (!ports)
		goto out;
	req.name_count = (size_t)PySequence_Fast_GET_SIZE(names);
	req.port_count = (size_t)PySequence_Fast_GET_SIZE(ports);
	nv = PyMem_Calloc(req.name_count ? req.name_count : 1, sizeof(*nv));
	pv = PyMem_Calloc(req.port_count ? req.port_count : 1, sizeof(*pv));
	if (!nv || !pv) {
		PyErr_NoMemory();
		goto out;
	}
	/* Borrowed: the sequences own the items, the str objects their UTF-8, and the GIL is held
	 * until encoding is done. A non-ASCII name reaches the encoder, which refuses it. */
	for (size_t i = 0; i < req.name_count; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(names, (Py_ssize_t)i);
		Py_ssize_t len;
		const char *utf8 = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &len) : NULL;
		if (!utf8) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError, "names must be a sequence of str");
			goto out;
		}
		nv[i] = (struct sbx_bytes){(const uint8_t *)utf8, (size_t)len};
	}
	for (size_t i = 0; i < req.port_count; i++)
		if (to_u32(PySequence_Fast_GET_ITEM(ports, (Py_ssize_t)i), "a port", &pv[i]) < 0)
			goto out;
	req.outbound = outbound;
	req.reattach = reattach;
	req.names = nv;
	req.ports = pv;
	req.ca_bundle = ca.buf;
	req.ca_len = (size_t)ca.len;
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_net_config(&vm->ch, &req, &err);
	result = pending_or_raise(vm, rc, &err);
out:
	PyMem_Free(nv);
	PyMem_Free(pv);
	Py_XDECREF(names);
	Py_XDECREF(ports);
	PyBuffer_Release(&ca);
	return result;
}

const char sbx_py_send_tool_result_doc[] =
	"send_tool_result(id, call, status, body) -> int\n\n"
	"Queue TOOL_RESULT, the answer to ToolCallEvent(id=id, call=call): status TOOL_OK with\n"
	"body the result as JSON text, or TOOL_ERROR with body the message (bytes-like, at most\n"
	"TOOL_RESULT_MAX); and try to write. Returns the bytes still pending. ValueError for call\n"
	"0, another status or a body over TOOL_RESULT_MAX; OSError(ENOBUFS) when the queue is\n"
	"full.";

PyObject *sbx_py_send_tool_result(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id, *o_call, *o_status, *result = NULL;
	Py_buffer body;
	struct sbx_tool_result_req r = {0};
	if (!PyArg_ParseTuple(args, "OOOy*:send_tool_result", &o_id, &o_call, &o_status, &body))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) == 0 && to_u32(o_id, "id", &r.id) == 0 &&
	    to_u32(o_call, "call", &r.call) == 0 && to_u32(o_status, "status", &r.status) == 0) {
		r.body = body.buf;
		r.body_len = (size_t)body.len;
		struct sbx_err err = {0};
		int rc = sbx_channel_queue_tool_result(&vm->ch, &r, &err);
		result = pending_or_raise(vm, rc, &err);
	}
	PyBuffer_Release(&body);
	return result;
}

/* Queue one PROC_* request (agent_request.h). */
static PyObject *queue_proc(struct sbx_vm *vm, const struct sbx_proc_req *r)
{
	struct sbx_err err = {0};
	int rc = sbx_channel_queue_proc(&vm->ch, r, &err);
	return pending_or_raise(vm, rc, &err);
}

#define PROC_SEND_NOTE                                                                         \
	"Returns the bytes still pending. ValueError for a request the protocol refuses (out of\n" \
	"range, over a limit); OSError(ENOBUFS) when the queue is full."

/* A Python int in 0 .. max (a u16 or u8 field); ValueError otherwise. */
static int to_small(PyObject *o, const char *name, uint32_t max, uint32_t *out)
{
	if (to_u32(o, name, out) < 0)
		return -1;
	if (*out > max) {
		PyErr_Format(PyExc_ValueError, "%s must be in 0 .. %u", name, max);
		return -1;
	}
	return 0;
}

const char sbx_py_send_proc_spawn_doc[] =
	"send_proc_spawn(id, argv, cwd, env, pty=False, cols=0, rows=0) -> int\n\n"
	"Queue PROC_SPAWN: argv (sequence of bytes, argv[0] looked up in PATH), cwd (bytes: an\n"
	"absolute path, or b'' for the EXEC working directory), env (list of (bytes, bytes)); with\n"
	"pty=True the process gets a terminal of cols x rows (1..PROC_TTY_MAX each). Answered by\n"
	"ProcInfoEvent (one entry) or ErrorEvent (ERR_SPAWN, ERR_LIMIT). " PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_spawn(struct sbx_vm *vm, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"id", "argv", "cwd", "env", "pty", "cols", "rows", NULL};
	PyObject *o_id, *o_argv, *o_env, *o_cols = NULL, *o_rows = NULL;
	PyObject *argv = NULL, *env = NULL, *result = NULL;
	Py_buffer cwd;
	int pty = 0;
	struct sbx_bytes *av = NULL;
	struct sbx_env_var *vars = NULL;
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_SPAWN};
	uint32_t cols = 0, rows = 0;
	Py_ssize_t env_count = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOy*O|pOO:send_proc_spawn", kwlist, &o_id,
					 &o_argv, &cwd, &o_env, &pty, &o_cols, &o_rows))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0)
		goto out;
	if ((o_cols && to_small(o_cols, "cols", UINT16_MAX, &cols) < 0) ||
	    (o_rows && to_small(o_rows, "rows", UINT16_MAX, &rows) < 0))
		goto out;
	argv = PySequence_Fast(o_argv, "argv must be a sequence of bytes");
	if (!argv)
		goto out;
	r.argc = (size_t)PySequence_Fast_GET_SIZE(argv);
	if (r.argc > SBX_PROC_ARGV_MAX) {
		PyErr_Format(PyExc_ValueError, "more than %u arguments", SBX_PROC_ARGV_MAX);
		goto out;
	}
	av = PyMem_Calloc(r.argc ? r.argc : 1, sizeof(*av));
	if (!av) {
		PyErr_NoMemory();
		goto out;
	}
	/* Borrowed: argv owns the items, the GIL is held until encoding is done. */
	for (size_t i = 0; i < r.argc; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(argv, (Py_ssize_t)i);
		if (!PyBytes_Check(item)) {
			PyErr_SetString(PyExc_TypeError, "argv must be a sequence of bytes");
			goto out;
		}
		av[i] = (struct sbx_bytes){(const uint8_t *)PyBytes_AS_STRING(item),
					   (size_t)PyBytes_GET_SIZE(item)};
	}
	if (env_vars(o_env, &env, &vars, &env_count) < 0)
		goto out;
	r.flags = pty ? (uint8_t)SBX_SPAWN_PTY : 0;
	r.cols = (uint16_t)cols;
	r.rows = (uint16_t)rows;
	r.argv = av;
	r.cwd = cwd.buf;
	r.cwd_len = (size_t)cwd.len;
	r.env = vars;
	r.env_count = (size_t)env_count;
	result = queue_proc(vm, &r);
out:
	PyMem_Free(av);
	PyMem_Free(vars);
	Py_XDECREF(argv);
	Py_XDECREF(env);
	PyBuffer_Release(&cwd);
	return result;
}

const char sbx_py_send_proc_read_doc[] =
	"send_proc_read(id, pid, stream, offset, max_bytes, wait_ms) -> int\n\n"
	"Queue PROC_READ of stream (PROC_STDOUT or PROC_STDERR) from offset, at most max_bytes\n"
	"(1..OUTPUT_CHUNK_MAX), the guest waiting up to wait_ms (0..PROC_WAIT_MS_MAX) for data.\n"
	"Answered by ProcDataEvent or ErrorEvent. " PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_read(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id, *o_pid, *o_stream, *o_max, *o_wait;
	unsigned long long offset;
	uint32_t stream;
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_READ};
	if (!PyArg_ParseTuple(args, "OOOKOO:send_proc_read", &o_id, &o_pid, &o_stream, &offset,
			      &o_max, &o_wait))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0 ||
	    to_u32(o_pid, "pid", &r.pid) < 0 || to_small(o_stream, "stream", 0xff, &stream) < 0 ||
	    to_u32(o_max, "max_bytes", &r.max) < 0 || to_u32(o_wait, "wait_ms", &r.wait_ms) < 0)
		return NULL;
	r.stream = (uint8_t)stream;
	r.offset = (uint64_t)offset;
	return queue_proc(vm, &r);
}

const char sbx_py_send_proc_write_doc[] =
	"send_proc_write(id, pid, data, close_stdin=False) -> int\n\n"
	"Queue PROC_WRITE: data (bytes-like, at most PROC_WRITE_MAX) to the process's stdin, then\n"
	"with close_stdin=True its stdin closed. Answered by ('pong', id) once written, or\n"
	"ErrorEvent (ERR_NO_PROCESS). " PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_write(struct sbx_vm *vm, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"id", "pid", "data", "close_stdin", NULL};
	PyObject *o_id, *o_pid, *result = NULL;
	Py_buffer data;
	int close_stdin = 0;
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_WRITE};
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOy*|p:send_proc_write", kwlist, &o_id, &o_pid,
					 &data, &close_stdin))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) == 0 && to_u32(o_id, "id", &r.id) == 0 &&
	    to_u32(o_pid, "pid", &r.pid) == 0) {
		r.flags = close_stdin ? (uint8_t)SBX_PROC_CLOSE_STDIN : 0;
		r.data = data.buf;
		r.data_len = (size_t)data.len;
		result = queue_proc(vm, &r);
	}
	PyBuffer_Release(&data);
	return result;
}

const char sbx_py_send_proc_signal_doc[] =
	"send_proc_signal(id, pid, signal) -> int\n\n"
	"Queue PROC_SIGNAL: signal (1..64) to the process's group. Answered by ('pong', id) or\n"
	"ErrorEvent (ERR_NO_PROCESS once it has ended). " PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_signal(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id, *o_pid, *o_sig;
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_SIGNAL};
	if (!PyArg_ParseTuple(args, "OOO:send_proc_signal", &o_id, &o_pid, &o_sig))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0 ||
	    to_u32(o_pid, "pid", &r.pid) < 0 || to_u32(o_sig, "signal", &r.signal) < 0)
		return NULL;
	return queue_proc(vm, &r);
}

const char sbx_py_send_proc_wait_doc[] =
	"send_proc_wait(id, pid, wait_ms) -> int\n\n"
	"Queue PROC_WAIT: answered by ProcInfoEvent (one entry) once the process has ended or\n"
	"wait_ms (0..PROC_WAIT_MS_MAX) passed (then flagged PROC_RUNNING), or ErrorEvent. "
	PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_wait(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id, *o_pid, *o_wait;
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_WAIT};
	if (!PyArg_ParseTuple(args, "OOO:send_proc_wait", &o_id, &o_pid, &o_wait))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0 ||
	    to_u32(o_pid, "pid", &r.pid) < 0 || to_u32(o_wait, "wait_ms", &r.wait_ms) < 0)
		return NULL;
	return queue_proc(vm, &r);
}

const char sbx_py_send_proc_list_doc[] =
	"send_proc_list(id) -> int\n\n"
	"Queue PROC_LIST: answered by ProcInfoEvent with every tracked process. " PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_list(struct sbx_vm *vm, PyObject *o_id)
{
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_LIST};
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0)
		return NULL;
	return queue_proc(vm, &r);
}

const char sbx_py_send_proc_resize_doc[] =
	"send_proc_resize(id, pid, cols, rows) -> int\n\n"
	"Queue PROC_RESIZE: the terminal's new size (1..PROC_TTY_MAX each). Answered by\n"
	"('pong', id) or ErrorEvent (ERR_NO_PROCESS: no terminal, or ended). " PROC_SEND_NOTE;

PyObject *sbx_py_send_proc_resize(struct sbx_vm *vm, PyObject *args)
{
	PyObject *o_id, *o_pid, *o_cols, *o_rows;
	uint32_t cols, rows;
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_RESIZE};
	if (!PyArg_ParseTuple(args, "OOOO:send_proc_resize", &o_id, &o_pid, &o_cols, &o_rows))
		return NULL;
	if (sbx_raise_if_closed(vm->closed) < 0 || to_u32(o_id, "id", &r.id) < 0 ||
	    to_u32(o_pid, "pid", &r.pid) < 0 || to_small(o_cols, "cols", UINT16_MAX, &cols) < 0 ||
	    to_small(o_rows, "rows", UINT16_MAX, &rows) < 0)
		return NULL;
	r.cols = (uint16_t)cols;
	r.rows = (uint16_t)rows;
	return queue_proc(vm, &r);
}

const char sbx_py_flush_doc[] = "flush() -> int\n\nWrite pending bytes as far as the socket takes them "
			"now; returns the bytes still pending.";

PyObject *sbx_py_flush(struct sbx_vm *vm)
{
	if (sbx_raise_if_closed(vm->closed) < 0)
		return NULL;
	struct sbx_err err = {0};
	int rc = sbx_channel_flush(&vm->ch, &err);
	return pending_or_raise(vm, rc, &err);
}
