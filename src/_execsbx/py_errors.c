/* C failures -> Python exceptions: see py_errors.h. */
#include "py_errors.h"

#include <errno.h>
#include <string.h>


/* OSError(err, "<strerror> (from <where>)"[, filename]), mapped by CPython to its subclass
 * (FileNotFoundError, BrokenPipeError, ...). err is positive. */
static PyObject *raise_os_error(int err, const char *where, PyObject *filename)
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

PyObject *sbx_raise_err(const struct sbx_err *e, PyObject *filename)
{
	if (e->code == ENOMEM)
		return PyErr_NoMemory();
	if (e->syscall)
		return raise_os_error(e->code, e->msg, filename);
	/* Without a failed system call, EBADF means the object was closed (like Python's files). */
	if (e->code == EINVAL || e->code == EMSGSIZE || e->code == E2BIG || e->code == EBADF) {
		PyErr_SetString(PyExc_ValueError, e->msg);
		return NULL;
	}
	PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", e->code, e->msg);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

PyObject *sbx_raise_protocol_error(PyObject *protocol_error, const struct sbx_err *e,
				   PyObject *events)
{
	PyObject *exc = PyObject_CallFunction(protocol_error, "is", e->code, e->msg);
	if (!events)
		events = PyList_New(0);
	if (exc && events && PyObject_SetAttrString(exc, "events", events) == 0)
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
	Py_XDECREF(exc);
	Py_XDECREF(events);
	return NULL;
}
