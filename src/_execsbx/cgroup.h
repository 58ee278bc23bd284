/* A per-VM cgroup with memory, CPU and pids limits, and the usage figures read back from it.
 * cgroup v2 where this process's cgroup is on a cgroup2 file system with the controllers
 * enabled for children; otherwise the v1 controllers memory, cpu, cpuacct and pids. The VM's
 * cgroup is created below the caller's own (so every limit of the caller still applies, and no
 * write outside the caller's subtree is needed), and removed when the VM is closed. Leftovers of a
 * caller that was SIGKILLed (named sbx-<dead pid>-<n>, empty) are removed when the next one is
 * removed. */
#ifndef SBX_CGROUP_H
#define SBX_CGROUP_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx_err.h"

#define SBX_CGROUP_MAX_DIRS 4
#define SBX_CGROUP_MAX_WRITES 8

struct sbx_cgroup_limits {
	uint64_t memory_bytes; /* 0: no memory limit */
	unsigned cpu_percent;  /* 100 = one full core; 0: no CPU limit */
	unsigned pids_max;     /* 0: no pids limit */
};

struct sbx_cgroup_write {
	unsigned dir;  /* index into dirs */
	int optional;  /* ENOENT is fine (a file the kernel may not have) */
	char file[40];
	char value[32];
};

struct sbx_cgroup {
	int version;                          /* 0 none, 1 or 2 */
	unsigned ndirs;
	char dirs[SBX_CGROUP_MAX_DIRS][PATH_MAX]; /* v1: memory, cpu, cpuacct, pids; v2: one */
	int has_memory, has_cpu, has_cpuacct, has_pids;
	unsigned nwrites;
	struct sbx_cgroup_write writes[SBX_CGROUP_MAX_WRITES]; /* the limits, in order */
};

/* Find where cgroups can be made and plan the VM's (name: a unique leaf name): its directories
 * and limit files, without creating anything (reads /proc/self/cgroup and the cgroup mounts).
 * 0, or -errno with err explaining (e.g. "no cgroup v1 memory controller mounted"). */
int sbx_cgroup_plan(struct sbx_cgroup *cg, const char *name, const struct sbx_cgroup_limits *lim,
		    struct sbx_err *err);
/* Create the planned directories and write the limits; with enter != 0 also move the calling
 * process into every directory. Async-signal-safe (mkdir, open, write, close on planned strings):
 * the spawned child does it for itself between clone and exec, so that the parent's event loop
 * never waits on cgroupfs (mkdir of a memory cgroup, and moving a task, which waits for an RCU
 * grace period, take milliseconds to tens of them on a busy host). 0, or -errno with *what
 * naming the step; what was made is left for sbx_cgroup_remove. */
int sbx_cgroup_materialize(const struct sbx_cgroup *cg, int enter, const char **what);
/* Plan and materialize in the calling process, without entering. On failure nothing is left
 * behind. */
int sbx_cgroup_create(struct sbx_cgroup *cg, const char *name, const struct sbx_cgroup_limits *lim,
		      struct sbx_err *err);
/* CPU time in ns and peak memory in bytes so far (each UINT64_MAX if unknown). */
void sbx_cgroup_usage(const struct sbx_cgroup *cg, uint64_t *cpu_ns, uint64_t *memory_peak);
/* Remove the directories (the processes in them must be gone; a directory that was never made
 * is fine), retrying for up to 2 s while the kernel still holds one, then the empty leftovers
 * of callers that were SIGKILLed. May sleep: not for an event loop's thread. Idempotent. */
void sbx_cgroup_remove(struct sbx_cgroup *cg);
/* A short file path relative to the cgroup, e.g. "memory.limit_in_bytes", read as an integer from
 * the directory that holds it. 0, or -errno with err filled: the failed open/read (-ENOENT: the
 * kernel has no such file), -EIO for a file that holds no number. */
int sbx_cgroup_read_u64(const char *dir, const char *file, uint64_t *out, struct sbx_err *err);

#endif /* SBX_CGROUP_H */
