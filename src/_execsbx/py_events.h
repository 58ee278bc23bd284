/* What the guest sent (event.h) as Python values: Vm.read_events(). */
#ifndef SBX_PY_EVENTS_H
#define SBX_PY_EVENTS_H

#include "py_common.h"

#include "vm.h"

/* Create the event types (struct sequences: attributes, and the positions of the tuples they
 * replaced) into st->event_types and add them to the module. 0 or -1. */
int sbx_py_event_types_add(PyObject *module, sbx_module_state *st);

/* Non-blocking: every complete event the channel holds now (reading at most 1 MiB), as a list;
 * EofEvent last once the guest closed. A protocol violation raises st->protocol_error (sticky). */
PyObject *sbx_py_read_events(struct sbx_vm *vm, const sbx_module_state *st);

#endif /* SBX_PY_EVENTS_H */
