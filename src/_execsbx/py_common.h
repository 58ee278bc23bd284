/* What every Python binding file (py_*.c) includes: Python.h and the module's state. The rest of
 * src/_execsbx is plain C and never includes Python.h. */
#ifndef SBX_PY_COMMON_H
#define SBX_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Per-module state (multi-phase init: no static PyObject*), owned by py_module.c. */
typedef struct {
	PyTypeObject *vm_type;
	PyObject *protocol_error; /* exec_sandbox._execsbx.ProtocolError, a subclass of OSError */
} sbx_module_state;

/* Append a new reference to list, dropping it; -1 (exception set) if item is NULL or the
 * append fails. */
static inline int sbx_py_append_new(PyObject *list, PyObject *item)
{
	if (!item)
		return -1;
	int rc = PyList_Append(list, item);
	Py_DECREF(item);
	return rc;
}

#endif /* SBX_PY_COMMON_H */
