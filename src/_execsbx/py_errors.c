/* C failures -> Python exceptions: see py_errors.h. */
#include "py_errors.h"

#include <errno.h>
#include <string.h>

#include "event.h"
#include "protocol.h"

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

int sbx_raise_if_closed(int closed)
{
	if (closed) {
		PyErr_SetString(PyExc_ValueError, "I/O operation on closed Vm");
		return -1;
	}
	return 0;
}

PyObject *sbx_raise_request_error(int rc, const char *why, const char *where)
{
	if (rc == -EINVAL || rc == -EMSGSIZE) {
		PyErr_SetString(PyExc_ValueError, why ? why : "invalid request");
		return NULL;
	}
	if (rc == -ENOMEM)
		return PyErr_NoMemory();
	return sbx_raise_os_error(-rc, where, NULL);
}

PyObject *sbx_raise_protocol_error(PyObject *protocol_error, const struct sbx_channel *ch,
				   PyObject *events)
{
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
	PyObject *exc = PyObject_CallFunction(protocol_error, "iN", -ch->error, msg);
	if (!events)
		events = PyList_New(0);
	if (exc && events && PyObject_SetAttrString(exc, "events", events) == 0)
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
	Py_XDECREF(exc);
	Py_XDECREF(events);
	return NULL;
}
