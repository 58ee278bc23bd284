/* The host jail as Python sees it: Vm()'s jail= dict in, jail_status() / resource_usage() /
 * cgroup_dirs() out (jail.h holds the jail itself). */
#ifndef SBX_PY_JAIL_H
#define SBX_PY_JAIL_H

#include "py_common.h"

#include "jail.h"

/* What the parsed config's pointers refer to, alive until sbx_py_jail_release. */
struct sbx_py_jail_storage {
	long groups[SBX_JAIL_GROUPS_MAX];
	PyObject *root_bytes; /* list of bytes (os.fsencode'd paths), or NULL */
	char **root;          /* PyMem, NULL-terminated, into root_bytes */
};

/* None (no jail) or a dict {'network', 'memory_mb', 'cpu_percent', 'pids_max', 'uid', 'gid',
 * 'groups' (list of int), 'seccomp' ('allow', 'deny' or 'log'), 'root' (list of paths)}, all
 * optional. 0, or -1 with TypeError/ValueError set; release st either way. */
int sbx_py_parse_jail(PyObject *o, struct sbx_jail_config *cfg, struct sbx_py_jail_storage *st);
void sbx_py_jail_release(struct sbx_py_jail_storage *st);
/* [(layer, active, detail), ...]; [] for j == NULL. */
PyObject *sbx_py_jail_status(const struct sbx_jail *j);
/* (cpu_ns | None, memory_peak_bytes | None), or None without a cgroup. Releases the GIL while it
 * reads a running VM's cgroup. */
PyObject *sbx_py_resource_usage(const struct sbx_jail *j);
/* The cgroup's directories; [] without one. */
PyObject *sbx_py_cgroup_dirs(const struct sbx_jail *j);

#endif /* SBX_PY_JAIL_H */
