/* Shared by the Python binding files (module.c, vm_type.c) only: the rest of src/_execsbx is
 * plain C and never includes Python.h. */
#ifndef SBX_BINDING_H
#define SBX_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "qemu_argv.h"

/* Per-module state (multi-phase init: no static PyObject*). */
typedef struct {
	PyTypeObject *vm_type;
	PyTypeObject *net_ring_type; /* net_ring_type.c */
	PyObject *protocol_error; /* exec_sandbox._execsbx.ProtocolError, a subclass of OSError */
} sbx_module_state;

/* A parsed VM config plus the objects that own its strings (release with
 * sbx_parsed_config_release). */
struct sbx_parsed_config {
	struct sbx_vm_config cfg;
	PyObject *qemu_binary; /* bytes (os.fsencode'd) */
	PyObject *kernel;
	PyObject *rootfs;
	PyObject *mem_path; /* bytes or NULL */
	PyObject *layer;    /* bytes or NULL */
	int mem_fd;         /* the caller's fd for the RAM file, or -1 */
};

/* Parse the keyword-only VM arguments shared by build_qemu_argv and Vm. With defaults != 0,
 * vcpus (1) and accel ("tcg") are optional. 0, or -1 with an exception set. */
int sbx_parse_vm_config(PyObject *args, PyObject *kwds, const char *fname, int defaults,
			struct sbx_parsed_config *pc);
void sbx_parsed_config_release(struct sbx_parsed_config *pc);
/* Build argv, raising ValueError/MemoryError on failure (NULL). */
char **sbx_build_argv_or_raise(const struct sbx_vm_config *cfg);
/* Raise OSError(err, "<strerror> (from <where>)"[, filename]) (mapped to its subclass, e.g.
 * FileNotFoundError). err is positive. Returns NULL. */
PyObject *sbx_raise_os_error(int err, const char *where, PyObject *filename);

/* vm_type.c */
int sbx_vm_type_add(PyObject *module, sbx_module_state *st);
/* net_ring_type.c */
int sbx_net_ring_type_add(PyObject *module, sbx_module_state *st);

#endif /* SBX_BINDING_H */
