/* Guest events -> Python values: see py_events.h. */
#include "py_events.h"

#include <errno.h>

#include "event.h"
#include "py_errors.h"

/* Per read_events() call: at most this many bytes are read, so one call stays short even if the
 * guest floods; the fd stays readable and the next call goes on. */
#define SBX_READ_EVENTS_BUDGET (1024u * 1024u)

/* Every event starts with kind (its name, str) and id, but EofEvent (kind only): the positions
 * are those of the tuples read_events() returned before, so that index access still works. */
#define KIND_FIELD {"kind", "what the guest sent: 'ready', 'stdout', 'exit', ..."}
#define ID_FIELD {"id", "the request id the frame answers (the host chose it)"}

static PyStructSequence_Field ready_fields[] = {
	KIND_FIELD, ID_FIELD,
	{"protocol_version", "the wire protocol version the agent speaks"},
	{"agent_version", "the agent's version string"}, {NULL, NULL}};
static PyStructSequence_Field output_fields[] = {
	KIND_FIELD, ID_FIELD, {"data", "bytes: a chunk of stdout, stderr or a file"}, {NULL, NULL}};
static PyStructSequence_Field exit_fields[] = {
	KIND_FIELD, ID_FIELD,
	{"exit_code", "the process's exit code, 128+signal, or -1 (timed out)"},
	{"flags", "EXIT_TIMED_OUT | EXIT_STDOUT_LIMIT | EXIT_STDERR_LIMIT | EXIT_REPL_RESET"},
	{"duration_us", "run time measured in the guest"}, {NULL, NULL}};
static PyStructSequence_Field error_fields[] = {
	KIND_FIELD, ID_FIELD, {"code", "ERR_* (error) or FILE_ERR_* (file_error)"},
	{"message", "the guest's explanation (str)"}, {NULL, NULL}};
static PyStructSequence_Field ack_fields[] = {KIND_FIELD, ID_FIELD, {NULL, NULL}};
static PyStructSequence_Field file_done_fields[] = {
	KIND_FIELD, ID_FIELD,
	{"total", "bytes written (write), sent (read) or entries listed (list)"}, {NULL, NULL}};
static PyStructSequence_Field file_entries_fields[] = {
	KIND_FIELD, ID_FIELD, {"entries", "list[FileEntry]: one batch of a listing"}, {NULL, NULL}};
static PyStructSequence_Field eof_fields[] = {KIND_FIELD, {NULL, NULL}};
static PyStructSequence_Field tool_call_fields[] = {
	KIND_FIELD, ID_FIELD,
	{"call", "the call's number within the execution (never 0): send_tool_result() echoes it"},
	{"name", "the tool's name (str, [A-Za-z_][A-Za-z0-9_]*)"},
	{"arguments", "bytes: JSON text, unparsed, at most TOOL_ARGS_MAX"}, {NULL, NULL}};
static PyStructSequence_Field output_chunk_fields[] = {
	KIND_FIELD, ID_FIELD, {"flags", "OUTPUT_BEGIN | OUTPUT_END (either, both or neither)"},
	{"mime_type", "the output's type (str, 'type/subtype') with OUTPUT_BEGIN, else ''"},
	{"data", "bytes: the next part of the output's data (may be empty)"}, {NULL, NULL}};
static PyStructSequence_Field proc_info_fields[] = {
	KIND_FIELD, ID_FIELD,
	{"processes", "list[ProcessEntry]: one (SPAWN, WAIT) or every tracked process (LIST)"},
	{NULL, NULL}};
static PyStructSequence_Field proc_data_fields[] = {
	KIND_FIELD, ID_FIELD,
	{"offset", "the stream offset of data's first byte (past the one asked for: dropped)"},
	{"flags", "PROC_DATA_EOF: nothing after these bytes will ever come"},
	{"data", "bytes: 0..OUTPUT_CHUNK_MAX bytes of the stream"}, {NULL, NULL}};
static PyStructSequence_Field proc_entry_fields[] = {
	{"pid", "the guest pid (never 0)"},
	{"flags", "PROC_RUNNING | PROC_PTY | PROC_STDIN_OPEN"},
	{"exit_code", "as ExitEvent's (128+N: killed by signal N); 0 while running"},
	{"stdout_bytes", "stdout bytes produced so far"},
	{"stderr_bytes", "stderr bytes produced so far"},
	{"command", "argv joined by spaces, cut to PROC_COMMAND_MAX bytes (str)"}, {NULL, NULL}};
static PyStructSequence_Field file_entry_fields[] = {
	{"name", "bytes: the entry's name"}, {"is_dir", "bool"}, {"size", "bytes (0 for a directory)"},
	{NULL, NULL}};

static PyStructSequence_Desc event_descs[SBX_PY_EVENT_TYPES] = {
	[SBX_PY_READY_EVENT] = {"exec_sandbox._execsbx.ReadyEvent",
				"The agent is up ('ready').", ready_fields, 4},
	[SBX_PY_OUTPUT_EVENT] = {"exec_sandbox._execsbx.OutputEvent",
				 "Bytes: 'stdout', 'stderr' or 'file_data'.", output_fields, 3},
	[SBX_PY_EXIT_EVENT] = {"exec_sandbox._execsbx.ExitEvent", "An execution ended ('exit').",
			       exit_fields, 5},
	[SBX_PY_ERROR_EVENT] = {"exec_sandbox._execsbx.ErrorEvent",
				"A request failed: 'error' or 'file_error'.", error_fields, 4},
	[SBX_PY_ACK_EVENT] = {"exec_sandbox._execsbx.AckEvent",
			      "A request was done: 'pong' or 'reseeded'.", ack_fields, 2},
	[SBX_PY_FILE_DONE_EVENT] = {"exec_sandbox._execsbx.FileDoneEvent",
				    "A file request ended well ('file_done').", file_done_fields, 3},
	[SBX_PY_FILE_ENTRIES_EVENT] = {"exec_sandbox._execsbx.FileEntriesEvent",
				       "A batch of a directory listing ('file_entries').",
				       file_entries_fields, 3},
	[SBX_PY_EOF_EVENT] = {"exec_sandbox._execsbx.EofEvent",
			      "The guest closed the channel ('eof'): last, and on every later call.",
			      eof_fields, 1},
	[SBX_PY_FILE_ENTRY] = {"exec_sandbox._execsbx.FileEntry", "One entry of a FileEntriesEvent.",
			       file_entry_fields, 3},
	[SBX_PY_TOOL_CALL_EVENT] = {"exec_sandbox._execsbx.ToolCallEvent",
				    "The running code called a host tool ('tool_call').",
				    tool_call_fields, 5},
	[SBX_PY_OUTPUT_CHUNK_EVENT] = {"exec_sandbox._execsbx.OutputChunkEvent",
				       "A frame of a rich output of the running code ('output').",
				       output_chunk_fields, 5},
	[SBX_PY_PROC_INFO_EVENT] = {"exec_sandbox._execsbx.ProcInfoEvent",
				    "Processes of the guest ('proc_info').", proc_info_fields, 3},
	[SBX_PY_PROC_DATA_EVENT] = {"exec_sandbox._execsbx.ProcDataEvent",
				    "Bytes of a process's output stream ('proc_data').",
				    proc_data_fields, 5},
	[SBX_PY_PROC_ENTRY] = {"exec_sandbox._execsbx.ProcessEntry",
			       "One process of a ProcInfoEvent.", proc_entry_fields, 6},
};

int sbx_py_event_types_add(PyObject *module, sbx_module_state *st)
{
	return sbx_py_add_struct_types(module, event_descs, SBX_PY_EVENT_TYPES, st->event_types);
}

/* A new instance of type t from n new references (stolen; NULL if any is NULL). */
static PyObject *make(const sbx_module_state *st, enum sbx_py_event_type t, int n,
		      PyObject *items[])
{
	return sbx_py_struct_new(st->event_types[t], n, items);
}

static PyObject *decode_text(const struct sbx_event *ev)
{
	return PyUnicode_DecodeUTF8((const char *)ev->data, (Py_ssize_t)ev->len, "replace");
}

/* The decoder let only ASCII through (a tool name, a mime type); "" when there is none. */
static PyObject *name_text(const struct sbx_event *ev)
{
	if (ev->name_len == 0)
		return PyUnicode_FromStringAndSize("", 0);
	return PyUnicode_DecodeASCII((const char *)ev->name, (Py_ssize_t)ev->name_len, "strict");
}

static PyObject *data_bytes(const struct sbx_event *ev)
{
	return PyBytes_FromStringAndSize((const char *)ev->data, (Py_ssize_t)ev->len);
}

/* [FileEntry(name, is_dir, size), ...]; the decoder validated every entry. */
static PyObject *entries_list(const sbx_module_state *st, const struct sbx_event *ev)
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
		PyObject *items[] = {
			PyBytes_FromStringAndSize((const char *)e.name, (Py_ssize_t)e.name_len),
			PyBool_FromLong(e.is_dir), PyLong_FromUnsignedLongLong(e.size)};
		PyObject *item = make(st, SBX_PY_FILE_ENTRY, 3, items);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
	return list;
}

/* [ProcessEntry(...), ...]; the decoder validated every entry. */
static PyObject *proc_list(const sbx_module_state *st, const struct sbx_event *ev)
{
	PyObject *list = PyList_New((Py_ssize_t)ev->count);
	if (!list)
		return NULL;
	struct sbx_cursor c = {ev->data, ev->len};
	for (uint32_t i = 0; i < ev->count; i++) {
		struct sbx_proc_entry e;
		if (sbx_proc_entry_next(&c, &e) < 0) {
			Py_DECREF(list);
			PyErr_SetString(PyExc_SystemError, "undecodable process after validation");
			return NULL;
		}
		PyObject *items[] = {
			PyLong_FromUnsignedLong(e.pid), PyLong_FromUnsignedLong(e.flags),
			PyLong_FromLong(e.exit_code), PyLong_FromUnsignedLongLong(e.stdout_bytes),
			PyLong_FromUnsignedLongLong(e.stderr_bytes),
			PyUnicode_DecodeUTF8((const char *)e.command, (Py_ssize_t)e.command_len,
					     "replace")};
		PyObject *item = make(st, SBX_PY_PROC_ENTRY, 6, items);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
	return list;
}

static PyObject *event_value(const sbx_module_state *st, const struct sbx_event *ev)
{
	PyObject *kind = PyUnicode_FromString(sbx_event_kind_name(ev->kind));
	PyObject *id = PyLong_FromUnsignedLong(ev->id);
	switch (ev->kind) {
	case SBX_EV_READY: {
		PyObject *items[] = {kind, id, PyLong_FromUnsignedLong(ev->protocol_version),
				     decode_text(ev)};
		return make(st, SBX_PY_READY_EVENT, 4, items);
	}
	case SBX_EV_STDOUT:
	case SBX_EV_STDERR:
	case SBX_EV_FILE_DATA: {
		PyObject *items[] = {kind, id, data_bytes(ev)};
		return make(st, SBX_PY_OUTPUT_EVENT, 3, items);
	}
	case SBX_EV_EXIT: {
		PyObject *items[] = {kind, id, PyLong_FromLong(ev->exit.exit_code),
				     PyLong_FromUnsignedLong(ev->exit.flags),
				     PyLong_FromUnsignedLongLong(ev->exit.duration_us)};
		return make(st, SBX_PY_EXIT_EVENT, 5, items);
	}
	case SBX_EV_ERROR:
	case SBX_EV_FILE_ERROR: {
		PyObject *items[] = {kind, id, PyLong_FromUnsignedLong(ev->error_code),
				     decode_text(ev)};
		return make(st, SBX_PY_ERROR_EVENT, 4, items);
	}
	case SBX_EV_PONG:
	case SBX_EV_RESEEDED: {
		PyObject *items[] = {kind, id};
		return make(st, SBX_PY_ACK_EVENT, 2, items);
	}
	case SBX_EV_FILE_DONE: {
		PyObject *items[] = {kind, id, PyLong_FromUnsignedLongLong(ev->value)};
		return make(st, SBX_PY_FILE_DONE_EVENT, 3, items);
	}
	case SBX_EV_FILE_ENTRIES: {
		PyObject *items[] = {kind, id, entries_list(st, ev)};
		return make(st, SBX_PY_FILE_ENTRIES_EVENT, 3, items);
	}
	case SBX_EV_TOOL_CALL: {
		PyObject *items[] = {kind, id, PyLong_FromUnsignedLong(ev->call), name_text(ev),
				     data_bytes(ev)};
		return make(st, SBX_PY_TOOL_CALL_EVENT, 5, items);
	}
	case SBX_EV_OUTPUT: {
		PyObject *items[] = {kind, id, PyLong_FromUnsignedLong(ev->flags), name_text(ev),
				     data_bytes(ev)};
		return make(st, SBX_PY_OUTPUT_CHUNK_EVENT, 5, items);
	}
	case SBX_EV_PROC_INFO: {
		PyObject *items[] = {kind, id, proc_list(st, ev)};
		return make(st, SBX_PY_PROC_INFO_EVENT, 3, items);
	}
	case SBX_EV_PROC_DATA: {
		PyObject *items[] = {kind, id, PyLong_FromUnsignedLongLong(ev->value),
				     PyLong_FromUnsignedLong(ev->flags), data_bytes(ev)};
		return make(st, SBX_PY_PROC_DATA_EVENT, 5, items);
	}
	}
	Py_XDECREF(kind);
	Py_XDECREF(id);
	PyErr_SetString(PyExc_SystemError, "unknown event kind");
	return NULL;
}

static PyObject *eof_value(const sbx_module_state *st)
{
	PyObject *items[] = {PyUnicode_FromString("eof")};
	return make(st, SBX_PY_EOF_EVENT, 1, items);
}

/* The channel's sticky protocol error as ProtocolError (events: stolen, may be NULL). */
static PyObject *protocol_error(const sbx_module_state *st, const struct sbx_channel *ch,
				PyObject *events)
{
	struct sbx_err err;
	sbx_channel_error(ch, &err);
	return sbx_raise_protocol_error(st->protocol_error, &err, events);
}

PyObject *sbx_py_read_events(struct sbx_vm *vm, const sbx_module_state *st)
{
	struct sbx_channel *ch = &vm->ch;
	if (sbx_raise_if_closed(vm->closed) < 0)
		return NULL;
	if (ch->error)
		return protocol_error(st, ch, NULL);
	PyObject *list = PyList_New(0);
	if (!list)
		return NULL;
	size_t budget = SBX_READ_EVENTS_BUDGET;
	for (;;) {
		struct sbx_event ev;
		int rc;
		/* Drain before every read: the decoder holds at most two maximal frames. */
		while ((rc = sbx_channel_next_event(ch, &ev)) == 1)
			if (sbx_py_append_new(list, event_value(st, &ev)) < 0)
				goto fail;
		if (rc < 0) /* raise now: the fd may never be readable again to report it later */
			return protocol_error(st, ch, list);
		if (ch->eof) {
			if (sbx_py_append_new(list, eof_value(st)) < 0)
				goto fail;
			break;
		}
		if (budget == 0)
			break;
		struct sbx_err err = {0};
		ssize_t n = sbx_channel_read(ch, budget, &err);
		if (n < 0) {
			if (ch->error)
				continue; /* reported by sbx_channel_next_event above */
			sbx_raise_err(&err, NULL);
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
