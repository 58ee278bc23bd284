/* The host jail around one QEMU process: seccomp, namespaces, a root of its own, a cgroup, rlimits
 * and an unprivileged user without capabilities. Prepared in the parent (sbx_jail_prepare: nothing there waits on the
 * kernel), the child makes and enters its cgroup and the rest itself between clone and exec
 * (sbx_jail_enter_*, async-signal-safe), and the cgroup's figures are read and the cgroup removed
 * after QEMU is reaped (sbx_jail_finish, off the caller's event loop). A layer the host cannot provide is switched off with its reason recorded in
 * status[], never silently; the caller logs it. */
#ifndef SBX_JAIL_H
#define SBX_JAIL_H

#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "cgroup.h"
#include "seccomp_filter.h"

enum sbx_layer {
	SBX_LAYER_SECCOMP,
	SBX_LAYER_NAMESPACES,
	SBX_LAYER_CGROUP,
	SBX_LAYER_RLIMITS,
	SBX_LAYER_USER,
	SBX_LAYER_ROOT,
	SBX_LAYER__COUNT,
};

struct sbx_layer_status {
	int active;
	char detail[256]; /* what is in force, or why not */
};

struct sbx_jail_config {
	int enabled;           /* 0: no jail (then everything below is ignored) */
	int network;           /* the VM has a network: keep the host's network namespace */
	uint64_t memory_bytes; /* cgroup memory limit; 0: none */
	unsigned cpu_percent;  /* cgroup CPU quota, 100 = one core; 0: none */
	unsigned pids_max;     /* cgroup pids limit (QEMU's threads); 0: none. All three 0: no cgroup */
	long uid, gid;         /* run QEMU as this user/group; -1: unchanged. A uid other than 0
				* also drops every capability (bounding set, ambient, inheritable) */
	const long *groups;    /* supplementary groups with the uid (e.g. /dev/kvm's); NULL/0: none */
	unsigned ngroups;
	enum sbx_seccomp_policy seccomp; /* 0: the allow-list */
	/* QEMU's root: a fresh tmpfs holding read-only binds of exactly these host paths, at the
	 * same paths, plus a /proc of its PID namespace; NULL: the host's tree, read-only. Needs the
	 * mount and PID namespaces (without them the layer is off, with the reason). */
	char *const *root_files; /* NULL-terminated */
};

#define SBX_JAIL_GROUPS_MAX 16
/* Files bound into QEMU's root: its binary, ~60 libraries, a module, firmware, 3 devices. */
#define SBX_ROOT_FILES_MAX 256

/* QEMU's root, planned by the parent (every path made before the clone), made by the child. */
struct sbx_root_plan {
	char *mnt;        /* host directory the tmpfs goes on, in the child's mount namespace */
	char **dirs;      /* to make under mnt, parents first (mnt-prefixed) */
	unsigned ndirs;
	char **sources;   /* host paths, opened O_PATH before the tmpfs hides anything */
	char **targets;   /* mnt-prefixed, same path */
	unsigned nfiles;
	char *proc;       /* mnt "/proc" */
};

#define SBX_JAIL_RLIMITS 4

struct sbx_jail {
	int enabled;
	const struct sbx_bpf *bpf; /* the process's shared program (sbx_seccomp_program); NULL if
				    * seccomp is off */
	int clone_flags;        /* CLONE_NEW* for clone(); 0 if namespaces are off */
	int read_only_root;     /* mount_setattr available */
	struct sbx_cgroup cg;   /* version 0 if no cgroup; planned here, made by the child */
	int cgroup_failed;      /* the child could not make or enter it: no figures, just removal */
	struct {
		int resource;
		struct rlimit limit;
	} rlimits[SBX_JAIL_RLIMITS];
	long uid, gid;
	unsigned ngroups;
	unsigned groups[SBX_JAIL_GROUPS_MAX]; /* gid_t for setgroups */
	struct sbx_root_plan *root; /* heap; NULL: no root of its own */
	enum sbx_seccomp_policy seccomp;
	struct sbx_layer_status status[SBX_LAYER__COUNT];
	int usage_valid;
	uint64_t cpu_ns, memory_peak; /* UINT64_MAX if the cgroup had no such figure */
};

extern const char *const sbx_layer_names[SBX_LAYER__COUNT];

/* Parent, before the clone; nothing here blocks for long (the seccomp program is built once per
 * process, the cgroup is only planned). name: a unique name for the VM's cgroup. Never fails
 * because a layer is unavailable (that layer is off, with its reason in status[]); 0, or on a
 * real error -ENOMEM or -EINVAL (a name that is empty or has a '/') with err filled. */
int sbx_jail_prepare(struct sbx_jail *j, const struct sbx_jail_config *cfg, const char *name,
		     struct sbx_err *err);
/* Parent, before the spawn: QEMU may write files up to bytes (RLIMIT_FSIZE, 0 by default): a VM
 * with writable disks gets the largest one's size, so it writes inside them and grows no file
 * past that. */
void sbx_jail_allow_file_size(struct sbx_jail *j, uint64_t bytes);
/* Parent: clone() refused the namespaces (err): record it and go on without them. */
void sbx_jail_namespaces_refused(struct sbx_jail *j, int err);
/* Child, first thing after the go: create its cgroup (planned by sbx_jail_prepare), write the
 * limits and move itself in, async-signal-safe, so that QEMU never runs outside it and the
 * parent never waits on cgroupfs. 0 or -errno with *what naming the step. Not fatal: the child
 * reports it and goes on without a cgroup, the parent records it (sbx_jail_cgroup_failed). */
int sbx_jail_enter_cgroup(const struct sbx_jail *j, const char **what);
/* Parent: the child's sbx_jail_enter_cgroup failed (err > 0, at step what): the cgroup layer is
 * off with that reason; whatever was made is removed by sbx_jail_finish. */
void sbx_jail_cgroup_failed(struct sbx_jail *j, int err, const char *what);
/* Child, in two phases, both async-signal-safe; 0 or -errno with *what naming the step.
 * Privileged phase, right after the child was placed in its cgroup: namespaces' mounts and the
 * new root (they need root), rlimits, then the user switch and the capabilities' drop. A credential change clears PR_SET_PDEATHSIG: the caller
 * must re-arm it when this returns 1 (it switched user), else 0.
 * Final phase, after the fds are in place, right before execve: no_new_privs, seccomp. */
int sbx_jail_enter_privileged(const struct sbx_jail *j, const char **what);
int sbx_jail_enter_final(const struct sbx_jail *j, const char **what);
/* After QEMU was reaped: read the cgroup's usage, remove it (may sleep: sbx_cgroup_remove).
 * Idempotent. */
void sbx_jail_finish(struct sbx_jail *j);
/* Release memory; removes the cgroup if still there. Idempotent. */
void sbx_jail_destroy(struct sbx_jail *j);

#endif /* SBX_JAIL_H */
