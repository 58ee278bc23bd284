/* The exec_sandbox._execsbx.Vm type (py_vm.c), added to the module by py_module.c. */
#ifndef SBX_PY_VM_H
#define SBX_PY_VM_H

#include "py_common.h"

/* Create the type from the module (stored in st->vm_type) and add it as "Vm". 0 or -1. */
int sbx_py_vm_type_add(PyObject *module, sbx_module_state *st);

#endif /* SBX_PY_VM_H */
