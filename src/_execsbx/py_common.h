/* What every Python binding file (py_*.c) includes: Python.h and the module's state. The rest of
 * src/_execsbx is plain C and never includes Python.h. */
#ifndef SBX_PY_COMMON_H
#define SBX_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* CPython's C API predates const: keyword lists are char *[] and slot values void *, filled with
 * string literals (and docstrings) that -Wwrite-strings makes const. In the binding files only,
 * those two warnings are off; the rest of the shared list (warnings.mk) holds. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wincompatible-pointer-types-discards-qualifiers"
#else
#pragma GCC diagnostic ignored "-Wdiscarded-qualifiers"
#endif
#pragma GCC diagnostic ignored "-Wcast-qual"

/* The struct sequence types read_events() returns (py_events.c). */
enum sbx_py_event_type {
	SBX_PY_READY_EVENT,
	SBX_PY_OUTPUT_EVENT,
	SBX_PY_EXIT_EVENT,
	SBX_PY_ERROR_EVENT,
	SBX_PY_ACK_EVENT,
	SBX_PY_FILE_DONE_EVENT,
	SBX_PY_FILE_ENTRIES_EVENT,
	SBX_PY_EOF_EVENT,
	SBX_PY_FILE_ENTRY,
	SBX_PY_TOOL_CALL_EVENT,
	SBX_PY_OUTPUT_CHUNK_EVENT,
	SBX_PY_PROC_INFO_EVENT,
	SBX_PY_PROC_DATA_EVENT,
	SBX_PY_PROC_ENTRY,
	SBX_PY_EVENT_TYPES
};

/* The struct sequence types NetRing.run() returns (py_net_ring.c). */
enum sbx_py_net_event_type {
	SBX_PY_NET_OPEN_EVENT,
	SBX_PY_NET_CONNECTED_EVENT,
	SBX_PY_NET_CLOSED_EVENT,
	SBX_PY_NET_RELAY_END_EVENT,
	SBX_PY_NET_REFUSED_EVENT,
	SBX_PY_NET_GUEST_REFUSED_EVENT,
	SBX_PY_NET_EVENT_TYPES
};

/* Per-module state (multi-phase init: no static PyObject*), owned by py_module.c. */
typedef struct {
	PyTypeObject *vm_type;
	PyTypeObject *net_ring_type; /* py_net_ring.c */
	PyObject *protocol_error; /* exec_sandbox._execsbx.ProtocolError, a subclass of OSError */
	PyTypeObject *event_types[SBX_PY_EVENT_TYPES];
	PyTypeObject *net_event_types[SBX_PY_NET_EVENT_TYPES];
} sbx_module_state;

/* Create n struct sequence types from descs into types[] and add them to the module. 0 or -1. */
static inline int sbx_py_add_struct_types(PyObject *module, PyStructSequence_Desc *descs, int n,
					  PyTypeObject **types)
{
	for (int i = 0; i < n; i++) {
		types[i] = PyStructSequence_NewType(&descs[i]);
		if (!types[i] || PyModule_AddType(module, types[i]) < 0)
			return -1;
	}
	return 0;
}

/* A new instance of the struct sequence type from its n fields, new references that are stolen
 * (NULL if any is NULL: an exception is set then, and the others are dropped). */
static inline PyObject *sbx_py_struct_new(PyTypeObject *type, int n, PyObject *items[])
{
	PyObject *o = NULL;
	for (int i = 0; i < n; i++)
		if (!items[i])
			goto out;
	o = PyStructSequence_New(type);
	if (!o)
		goto out;
	for (int i = 0; i < n; i++) {
		PyStructSequence_SetItem(o, i, items[i]);
		items[i] = NULL;
	}
out:
	for (int i = 0; i < n; i++)
		Py_XDECREF(items[i]);
	return o;
}

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

/* The flags of the module's own heap types: immutable where this CPython has the flag. */
#ifdef Py_TPFLAGS_IMMUTABLETYPE
#define SBX_PY_TYPE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define SBX_PY_TYPE_FLAGS Py_TPFLAGS_DEFAULT
#endif

/* Create the heap type of spec for module, keep it in *slot (module state) and add it to the
 * module; -1 with an exception set on failure. */
static inline int sbx_py_add_type(PyObject *module, PyType_Spec *spec, PyTypeObject **slot)
{
	*slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, NULL);
	if (!*slot)
		return -1;
	return PyModule_AddType(module, *slot);
}

#endif /* SBX_PY_COMMON_H */
