/* The one place where a C failure becomes a Python exception (docs/c-conventions.md). Every
 * function raises and returns NULL (or -1 where it says so). */
#ifndef SBX_PY_ERRORS_H
#define SBX_PY_ERRORS_H

#include "py_common.h"

#include "agent_channel.h"

/* ValueError("I/O operation on closed Vm") and -1 if closed, else 0. */
int sbx_raise_if_closed(int closed);
/* The exception for a filled struct sbx_err (sbx_err.h): MemoryError for ENOMEM; ValueError(msg)
 * for an invalid request or configuration, or a closed object (EINVAL, EMSGSIZE, E2BIG, EBADF
 * without a failed system call); for a failed system
 * call OSError(code, "<strerror> (from <step>)"[, filename]); else OSError(code, msg). */
PyObject *sbx_raise_err(const struct sbx_err *e, PyObject *filename);
/* ProtocolError(e->code, e->msg) for the channel's sticky error (sbx_channel_error); its .events
 * is events (a list, new reference stolen; NULL: an empty list). protocol_error is the module's
 * ProtocolError type. */
PyObject *sbx_raise_protocol_error(PyObject *protocol_error, const struct sbx_err *e,
				   PyObject *events);

#endif /* SBX_PY_ERRORS_H */
