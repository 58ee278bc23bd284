/* Guest events -> Python values: see py_events.h. */
#include "py_events.h"

#include <errno.h>

#include "event.h"
#include "py_errors.h"

/* Per read_events() call: at most this many bytes are read, so one call stays short even if the
 * guest floods; the fd stays readable and the next call goes on. */
#define SBX_READ_EVENTS_BUDGET (1024u * 1024u)

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

PyObject *sbx_py_read_events(struct sbx_vm *vm, PyObject *protocol_error)
{
	struct sbx_channel *ch = &vm->ch;
	if (sbx_raise_if_closed(vm->closed) < 0)
		return NULL;
	if (ch->error)
		return sbx_raise_protocol_error(protocol_error, ch, NULL);
	PyObject *list = PyList_New(0);
	if (!list)
		return NULL;
	size_t budget = SBX_READ_EVENTS_BUDGET;
	for (;;) {
		struct sbx_event ev;
		int rc;
		/* Drain before every read: the decoder holds at most two maximal frames. */
		while ((rc = sbx_channel_next_event(ch, &ev)) == 1)
			if (sbx_py_append_new(list, event_to_tuple(&ev)) < 0)
				goto fail;
		if (rc < 0) /* raise now: the fd may never be readable again to report it later */
			return sbx_raise_protocol_error(protocol_error, ch, list);
		if (ch->eof) {
			if (sbx_py_append_new(list, Py_BuildValue("(s)", "eof")) < 0)
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
