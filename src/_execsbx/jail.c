/* See jail.h; the reasons for each layer are in docs/security.md. */
#define _GNU_SOURCE 1
#include "jail.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "namespaces.h"

const char *const sbx_layer_names[SBX_LAYER__COUNT] = {
	[SBX_LAYER_SECCOMP] = "seccomp",
	[SBX_LAYER_NAMESPACES] = "namespaces",
	[SBX_LAYER_CGROUP] = "cgroup",
	[SBX_LAYER_RLIMITS] = "rlimits",
	[SBX_LAYER_USER] = "user",
};

__attribute__((format(printf, 4, 5))) static void set_status(struct sbx_jail *j, enum sbx_layer l,
							     int active, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(j->status[l].detail, sizeof(j->status[l].detail), fmt, ap);
	va_end(ap);
	j->status[l].active = active;
}

static void init_empty(struct sbx_jail *j)
{
	memset(j, 0, sizeof(*j));
	j->uid = j->gid = -1;
	j->cpu_ns = j->memory_peak = UINT64_MAX;
}

int sbx_jail_prepare(struct sbx_jail *j, const struct sbx_jail_config *cfg, const char *name,
		     struct sbx_err *err)
{
	init_empty(j);
	if (!cfg || !cfg->enabled) {
		for (int l = 0; l < SBX_LAYER__COUNT; l++)
			set_status(j, (enum sbx_layer)l, 0, "jail disabled by the caller");
		return 0;
	}
	j->enabled = 1;

	/* seccomp */
	struct sbx_err why = {0}; /* why a layer is off: its status, not a failure */
	char text[sizeof(why.msg) + 64];
	int rc = sbx_seccomp_program(&j->bpf, &why);
	if (rc == -ENOMEM) {
		*err = why;
		return rc;
	}
	if (rc < 0)
		set_status(j, SBX_LAYER_SECCOMP, 0, "cannot build the filter: %s",
			   sbx_err_text(&why, text, sizeof(text)));
	else
		set_status(j, SBX_LAYER_SECCOMP, 1, "deny-list filter of %u BPF instructions",
			   (unsigned)j->bpf->len);

	/* namespaces: decided here, confirmed by clone() (sbx_jail_namespaces_refused) */
	j->clone_flags = sbx_ns_clone_flags(cfg->network);
	j->read_only_root = sbx_ns_have_mount_setattr();
	set_status(j, SBX_LAYER_NAMESPACES, 1, "mount (private%s), ipc, uts, pid%s",
		   j->read_only_root ? ", read-only" : "; no mount_setattr: writable",
		   cfg->network ? " (host network namespace: the VM has a network)" : ", net");

	/* cgroup */
	struct sbx_cgroup_limits lim = {cfg->memory_bytes, cfg->cpu_percent, cfg->pids_max};
	sbx_err_clear(&why);
	if (!name || !name[0] || strchr(name, '/'))
		return sbx_err_set(err, -EINVAL, "cgroup name \"%s\": empty or with a '/'",
				   name ? name : "");
	if (!lim.memory_bytes && !lim.cpu_percent && !lim.pids_max)
		rc = sbx_err_set(&why, -EINVAL, "no limits requested by the caller");
	else
		rc = sbx_cgroup_plan(&j->cg, name, &lim, &why);
	if (rc < 0)
		set_status(j, SBX_LAYER_CGROUP, 0, "%s", sbx_err_text(&why, text, sizeof(text)));
	else
		set_status(j, SBX_LAYER_CGROUP, 1,
			   "v%d: memory %llu MiB, cpu %u%%, pids %u", j->cg.version,
			   (unsigned long long)(cfg->memory_bytes >> 20), cfg->cpu_percent,
			   cfg->pids_max);

	/* rlimits: no core dumps (they would hold guest memory), no files written, few fds, no
	 * locked memory. Address space stays unlimited: TCG reserves a large code buffer. */
	j->rlimits[0].resource = RLIMIT_CORE;
	j->rlimits[0].limit = (struct rlimit){0, 0};
	j->rlimits[1].resource = RLIMIT_FSIZE;
	j->rlimits[1].limit = (struct rlimit){0, 0};
	j->rlimits[2].resource = RLIMIT_NOFILE;
	j->rlimits[2].limit = (struct rlimit){1024, 1024};
	j->rlimits[3].resource = RLIMIT_MEMLOCK;
	j->rlimits[3].limit = (struct rlimit){64 * 1024, 64 * 1024};
	set_status(j, SBX_LAYER_RLIMITS, 1, "core 0, fsize 0, nofile 1024, memlock 64 KiB");

	/* user */
	j->uid = cfg->uid;
	j->gid = cfg->gid;
	if (cfg->uid < 0)
		set_status(j, SBX_LAYER_USER, 0, "no unprivileged user configured "
						 "(EXEC_SANDBOX_QEMU_USER); QEMU keeps the caller's uid %d",
			   (int)getuid());
	else
		set_status(j, SBX_LAYER_USER, 1, "uid %ld, gid %ld, no supplementary groups", cfg->uid,
			   cfg->gid < 0 ? cfg->uid : cfg->gid);
	return 0;
}

void sbx_jail_namespaces_refused(struct sbx_jail *j, int err)
{
	j->clone_flags = 0;
	set_status(j, SBX_LAYER_NAMESPACES, 0, "clone(CLONE_NEW*) refused: %s", strerror(err));
}

int sbx_jail_enter_cgroup(const struct sbx_jail *j, const char **what)
{
	if (!j->enabled || !j->cg.version)
		return 0;
	return sbx_cgroup_materialize(&j->cg, 1, what);
}

void sbx_jail_cgroup_failed(struct sbx_jail *j, int err, const char *what)
{
	j->cgroup_failed = 1;
	set_status(j, SBX_LAYER_CGROUP, 0, "making QEMU's cgroup failed (%s): %s",
		   what ? what : "cgroup", strerror(err));
}

int sbx_jail_enter_privileged(const struct sbx_jail *j, const char **what)
{
	int rc;
	if (!j->enabled)
		return 0;
	if (j->clone_flags) {
		rc = sbx_ns_setup_child(j->clone_flags, j->read_only_root, what);
		if (rc < 0)
			return rc;
	}
	for (int i = 0; i < SBX_JAIL_RLIMITS; i++) {
		*what = "setrlimit";
		if (setrlimit(j->rlimits[i].resource, &j->rlimits[i].limit) < 0)
			return -errno;
	}
	if (j->uid < 0)
		return 0;
	/* Raw syscalls, not glibc's wrappers: in a child made by a raw clone() glibc still lists the
	 * parent's threads, and its wrappers would run the all-threads setxid protocol over that list
	 * (take the stack-list lock, wait for threads that were being created at the time of the
	 * clone): a deadlock before execve. The kernel's calls change this thread only, which here is
	 * the whole process. */
	long gid = j->gid >= 0 ? j->gid : j->uid;
	*what = "setgroups";
	if (syscall(SYS_setgroups, 0, NULL) < 0)
		return -errno;
	*what = "setresgid";
	if (syscall(SYS_setresgid, gid, gid, gid) < 0)
		return -errno;
	*what = "setresuid";
	if (syscall(SYS_setresuid, j->uid, j->uid, j->uid) < 0)
		return -errno;
	return 1;
}

int sbx_jail_enter_final(const struct sbx_jail *j, const char **what)
{
	if (!j->enabled)
		return 0;
	/* no_new_privs is also what lets an unprivileged process install a filter. */
	*what = "prctl(PR_SET_NO_NEW_PRIVS)";
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -errno;
	if (j->bpf) {
		*what = "prctl(PR_SET_SECCOMP)";
		int rc = sbx_seccomp_load(j->bpf);
		if (rc < 0)
			return rc;
	}
	return 0;
}

void sbx_jail_finish(struct sbx_jail *j)
{
	if (j->cg.version) {
		if (!j->cgroup_failed) {
			sbx_cgroup_usage(&j->cg, &j->cpu_ns, &j->memory_peak);
			j->usage_valid = 1;
		}
		sbx_cgroup_remove(&j->cg);
	}
}

void sbx_jail_destroy(struct sbx_jail *j)
{
	sbx_cgroup_remove(&j->cg);
	j->bpf = NULL; /* shared, never freed */
	j->enabled = 0;
}
