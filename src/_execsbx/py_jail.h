/* The host jail as Python sees it: Vm()'s jail= dict in, jail_status() / resource_usage() /
 * cgroup_dirs() out (jail.h holds the jail itself). */
#ifndef SBX_PY_JAIL_H
#define SBX_PY_JAIL_H

#include "py_common.h"

#include "jail.h"

/* None (no jail) or a dict {'network', 'memory_mb', 'cpu_percent', 'pids_max', 'uid', 'gid'},
 * all optional. 0, or -1 with TypeError/ValueError set. */
int sbx_py_parse_jail(PyObject *o, struct sbx_jail_config *cfg);
/* [(layer, active, detail), ...]; [] for j == NULL. */
PyObject *sbx_py_jail_status(const struct sbx_jail *j);
/* (cpu_ns | None, memory_peak_bytes | None), or None without a cgroup. Releases the GIL while it
 * reads a running VM's cgroup. */
PyObject *sbx_py_resource_usage(const struct sbx_jail *j);
/* The cgroup's directories; [] without one. */
PyObject *sbx_py_cgroup_dirs(const struct sbx_jail *j);

#endif /* SBX_PY_JAIL_H */
