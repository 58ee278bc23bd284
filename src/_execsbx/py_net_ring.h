/* exec_sandbox._execsbx.NetRing (py_net_ring.c): the binding of the network relay. */
#ifndef SBX_PY_NET_RING_H
#define SBX_PY_NET_RING_H

#include "py_common.h"

int sbx_py_net_ring_type_add(PyObject *module, sbx_module_state *st);

#endif /* SBX_PY_NET_RING_H */
