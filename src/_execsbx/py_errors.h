/* The one place where a C failure becomes a Python exception (docs/c-conventions.md). Every
 * function raises and returns NULL (or -1 where it says so). */
#ifndef SBX_PY_ERRORS_H
#define SBX_PY_ERRORS_H

#include "py_common.h"

#include "agent_channel.h"

/* OSError(err, "<strerror> (from <where>)"[, filename]), mapped by CPython to its subclass
 * (FileNotFoundError, BrokenPipeError, ...). err is positive. */
PyObject *sbx_raise_os_error(int err, const char *where, PyObject *filename);
/* ValueError("I/O operation on closed Vm") and -1 if closed, else 0. */
int sbx_raise_if_closed(int closed);
/* The result of queueing a request (0 or -errno from agent_channel.h) as an exception:
 * ValueError(why) for -EINVAL/-EMSGSIZE, MemoryError, else OSError(-rc, where). */
PyObject *sbx_raise_request_error(int rc, const char *why, const char *where);
/* ProtocolError(errno, text) for the channel's sticky error; its .events is events (a list, new
 * reference stolen; NULL: an empty list). protocol_error is the module's ProtocolError type. */
PyObject *sbx_raise_protocol_error(PyObject *protocol_error, const struct sbx_channel *ch,
				   PyObject *events);

#endif /* SBX_PY_ERRORS_H */
