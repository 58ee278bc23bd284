/* The keyword-only VM arguments shared by build_qemu_argv() (py_module.c) and Vm() (py_vm.c),
 * parsed into a struct sbx_vm_config (qemu_argv.h). */
#ifndef SBX_PY_CONFIG_H
#define SBX_PY_CONFIG_H

#include "py_common.h"

#include "qemu_argv.h"

/* A parsed VM config plus the objects that own its strings (release with
 * sbx_parsed_config_release). */
struct sbx_parsed_config {
	struct sbx_vm_config cfg;
	PyObject *qemu_binary; /* bytes (os.fsencode'd) */
	PyObject *kernel;
	PyObject *rootfs;
	PyObject *mem_path; /* bytes or NULL */
	/* cfg.disks points here; each path (bytes) and kind (str) is owned by a reference of its own,
	 * so a list the caller changes meanwhile (another thread, while Vm() runs without the GIL)
	 * cannot free them. */
	struct sbx_vm_disk disks[SBX_VM_DISKS_MAX];
	PyObject *disk_paths[SBX_VM_DISKS_MAX];
	PyObject *disk_kinds[SBX_VM_DISKS_MAX];
	int mem_fd;         /* the caller's fd for the RAM file, or -1 */
};

/* With defaults != 0, vcpus (1) and accel ("tcg") are optional. 0, or -1 with an exception
 * set. */
int sbx_parse_vm_config(PyObject *args, PyObject *kwds, const char *fname, int defaults,
			struct sbx_parsed_config *pc);
void sbx_parsed_config_release(struct sbx_parsed_config *pc);
/* Build argv, raising ValueError/MemoryError on failure (NULL). */
char **sbx_build_argv_or_raise(const struct sbx_vm_config *cfg);

#endif /* SBX_PY_CONFIG_H */
