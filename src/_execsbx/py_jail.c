/* The jail as Python sees it: see py_jail.h. */
#include "py_jail.h"

#include <stdint.h>
#include <string.h>

/* One optional int item of the jail dict; 0 or -1 with an exception set. */
static int jail_int(PyObject *dict, const char *key, long long lo, long long hi, long long *out)
{
	PyObject *v = PyDict_GetItemString(dict, key); /* borrowed */
	if (!v)
		return 0;
	if (!PyLong_Check(v)) {
		PyErr_Format(PyExc_TypeError, "jail['%s'] must be an int", key);
		return -1;
	}
	long long x = PyLong_AsLongLong(v);
	if (x == -1 && PyErr_Occurred())
		return -1;
	if (x < lo || x > hi) {
		PyErr_Format(PyExc_ValueError, "jail['%s'] out of range (%lld .. %lld)", key, lo, hi);
		return -1;
	}
	*out = x;
	return 0;
}

static const char *const jail_keys[] = {"network", "memory_mb", "cpu_percent", "pids_max", "uid",
					"gid", "groups", "seccomp", "root", NULL};

void sbx_py_jail_release(struct sbx_py_jail_storage *st)
{
	PyMem_Free(st->root);
	st->root = NULL;
	Py_CLEAR(st->root_bytes);
}

static int jail_groups(PyObject *dict, struct sbx_jail_config *cfg, struct sbx_py_jail_storage *st)
{
	PyObject *v = PyDict_GetItemString(dict, "groups"); /* borrowed */
	if (!v)
		return 0;
	if (!PyList_Check(v) || PyList_GET_SIZE(v) > SBX_JAIL_GROUPS_MAX) {
		PyErr_Format(PyExc_TypeError, "jail['groups'] must be a list of at most %d ints",
			     SBX_JAIL_GROUPS_MAX);
		return -1;
	}
	for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
		PyObject *g = PyList_GET_ITEM(v, i);
		if (!PyLong_Check(g)) {
			PyErr_SetString(PyExc_TypeError, "jail['groups'] must be a list of ints");
			return -1;
		}
		long x = PyLong_AsLong(g);
		if (x == -1 && PyErr_Occurred())
			return -1;
		if (x < 0 || x > 0x7fffffffL) {
			PyErr_SetString(PyExc_ValueError, "jail['groups']: a gid out of range");
			return -1;
		}
		st->groups[i] = x;
	}
	cfg->groups = st->groups;
	cfg->ngroups = (unsigned)PyList_GET_SIZE(v);
	return 0;
}

static int jail_seccomp(PyObject *dict, struct sbx_jail_config *cfg)
{
	PyObject *v = PyDict_GetItemString(dict, "seccomp"); /* borrowed */
	if (!v)
		return 0;
	static const struct {
		const char *name;
		enum sbx_seccomp_policy policy;
	} names[] = {{"allow", SBX_SECCOMP_ALLOW_LIST},
		     {"deny", SBX_SECCOMP_DENY_LIST},
		     {"log", SBX_SECCOMP_ALLOW_LIST_LOG}};
	for (size_t i = 0; PyUnicode_Check(v) && i < sizeof(names) / sizeof(names[0]); i++)
		if (PyUnicode_CompareWithASCIIString(v, names[i].name) == 0) {
			cfg->seccomp = names[i].policy;
			return 0;
		}
	PyErr_Format(PyExc_ValueError, "jail['seccomp'] must be 'allow', 'deny' or 'log', not %R",
		     v);
	return -1;
}

static int jail_root(PyObject *dict, struct sbx_jail_config *cfg, struct sbx_py_jail_storage *st)
{
	PyObject *v = PyDict_GetItemString(dict, "root"); /* borrowed */
	if (!v || v == Py_None)
		return 0;
	if (!PyList_Check(v) || PyList_GET_SIZE(v) > SBX_ROOT_FILES_MAX) {
		PyErr_Format(PyExc_TypeError, "jail['root'] must be a list of at most %d paths",
			     SBX_ROOT_FILES_MAX);
		return -1;
	}
	Py_ssize_t n = PyList_GET_SIZE(v);
	st->root_bytes = PyList_New(n);
	st->root = PyMem_Calloc((size_t)n + 1, sizeof(char *));
	if (!st->root_bytes || !st->root) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *b = NULL;
		if (!PyUnicode_FSConverter(PyList_GET_ITEM(v, i), &b))
			return -1;
		PyList_SET_ITEM(st->root_bytes, i, b);
		st->root[i] = PyBytes_AS_STRING(b);
	}
	cfg->root_files = st->root;
	return 0;
}

/* The jail keyword of Vm(): None (no jail) or a dict with the keys above, all optional. */
int sbx_py_parse_jail(PyObject *o, struct sbx_jail_config *cfg, struct sbx_py_jail_storage *st)
{
	memset(cfg, 0, sizeof(*cfg));
	memset(st, 0, sizeof(*st));
	cfg->uid = cfg->gid = -1;
	if (!o || o == Py_None)
		return 0;
	if (!PyDict_Check(o)) {
		PyErr_SetString(PyExc_TypeError, "jail must be a dict or None");
		return -1;
	}
	PyObject *key;
	Py_ssize_t pos = 0;
	while (PyDict_Next(o, &pos, &key, NULL)) {
		int known = 0;
		for (const char *const *k = jail_keys; *k; k++)
			if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, *k) == 0)
				known = 1;
		if (!known) {
			PyErr_Format(PyExc_TypeError, "unknown jail option %R", key);
			return -1;
		}
	}
	long long network = 0, mem = 0, cpu = 0, pids = 0, uid = -1, gid = -1;
	if (jail_int(o, "network", 0, 1, &network) < 0 ||
	    jail_int(o, "memory_mb", 0, 1 << 24, &mem) < 0 ||
	    jail_int(o, "cpu_percent", 0, 100000, &cpu) < 0 ||
	    jail_int(o, "pids_max", 0, 1 << 22, &pids) < 0 ||
	    jail_int(o, "uid", -1, 0x7fffffff, &uid) < 0 ||
	    jail_int(o, "gid", -1, 0x7fffffff, &gid) < 0 || jail_groups(o, cfg, st) < 0 ||
	    jail_seccomp(o, cfg) < 0 || jail_root(o, cfg, st) < 0)
		return -1;
	cfg->enabled = 1;
	cfg->network = (int)network;
	cfg->memory_bytes = (uint64_t)mem << 20;
	cfg->cpu_percent = (unsigned)cpu;
	cfg->pids_max = (unsigned)pids;
	cfg->uid = (long)uid;
	cfg->gid = (long)gid;
	return 0;
}

PyObject *sbx_py_jail_status(const struct sbx_jail *j)
{
	PyObject *list = PyList_New(0);
	if (!list || !j)
		return list;
	for (int l = 0; l < SBX_LAYER__COUNT; l++)
		if (sbx_py_append_new(list, Py_BuildValue("(sNs)", sbx_layer_names[l],
						   PyBool_FromLong(j->status[l].active),
						   j->status[l].detail)) < 0) {
			Py_DECREF(list);
			return NULL;
		}
	return list;
}

static PyObject *u64_or_none(uint64_t v)
{
	if (v == UINT64_MAX)
		Py_RETURN_NONE;
	return PyLong_FromUnsignedLongLong(v);
}

PyObject *sbx_py_resource_usage(const struct sbx_jail *j)
{
	if (!j)
		Py_RETURN_NONE;
	if (j->usage_valid)
		return Py_BuildValue("(NN)", u64_or_none(j->cpu_ns), u64_or_none(j->memory_peak));
	if (!j->cg.version || j->cgroup_failed)
		Py_RETURN_NONE;
	/* Still running: the figures so far (a few small file reads, which can wait on cgroupfs
	 * locks for milliseconds: the GIL is released, and an event loop calls this from a
	 * thread). */
	uint64_t cpu_ns, memory_peak;
	Py_BEGIN_ALLOW_THREADS
	sbx_cgroup_usage(&j->cg, &cpu_ns, &memory_peak);
	Py_END_ALLOW_THREADS
	return Py_BuildValue("(NN)", u64_or_none(cpu_ns), u64_or_none(memory_peak));
}

PyObject *sbx_py_cgroup_dirs(const struct sbx_jail *j)
{
	PyObject *list = PyList_New(0);
	if (!list || !j || j->cgroup_failed)
		return list;
	for (unsigned i = 0; i < j->cg.ndirs; i++)
		if (sbx_py_append_new(list, PyUnicode_DecodeFSDefault(j->cg.dirs[i])) < 0) {
			Py_DECREF(list);
			return NULL;
		}
	return list;
}
