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
					"gid", NULL};

/* The jail keyword of Vm(): None (no jail) or a dict with the keys above, all optional. */
int sbx_py_parse_jail(PyObject *o, struct sbx_jail_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
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
	    jail_int(o, "gid", -1, 0x7fffffff, &gid) < 0)
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
