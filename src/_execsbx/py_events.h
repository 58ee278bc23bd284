/* What the guest sent (event.h) as Python values: Vm.read_events(). */
#ifndef SBX_PY_EVENTS_H
#define SBX_PY_EVENTS_H

#include "py_common.h"

#include "vm.h"

/* Non-blocking: every complete event the channel holds now (reading at most 1 MiB), as a list;
 * ('eof',) last once the guest closed. A protocol violation raises protocol_error (the module's
 * ProtocolError type; sticky). */
PyObject *sbx_py_read_events(struct sbx_vm *vm, PyObject *protocol_error);

#endif /* SBX_PY_EVENTS_H */
