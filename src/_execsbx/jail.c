/* See jail.h; the reasons for each layer are in docs/security.md. */
#define _GNU_SOURCE 1
#include "jail.h"

#include <errno.h>
#include <stdarg.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "namespaces.h"
#include <sched.h>

const char *const sbx_layer_names[SBX_LAYER__COUNT] = {
	[SBX_LAYER_SECCOMP] = "seccomp",
	[SBX_LAYER_NAMESPACES] = "namespaces",
	[SBX_LAYER_CGROUP] = "cgroup",
	[SBX_LAYER_RLIMITS] = "rlimits",
	[SBX_LAYER_USER] = "user",
	[SBX_LAYER_ROOT] = "root",
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

static void free_plan(struct sbx_root_plan *p)
{
	if (!p)
		return;
	for (unsigned i = 0; i < p->ndirs; i++)
		free(p->dirs[i]);
	for (unsigned i = 0; i < p->nfiles; i++) {
		free(p->sources[i]);
		free(p->targets[i]);
	}
	free(p->dirs);
	free(p->sources);
	free(p->targets);
	free(p->mnt);
	free(p->proc);
	free(p);
}

static char *joined(const char *a, const char *b, size_t blen)
{
	size_t alen = strlen(a);
	char *s = malloc(alen + blen + 1);
	if (s) {
		memcpy(s, a, alen);
		memcpy(s + alen, b, blen);
		s[alen + blen] = 0;
	}
	return s;
}

/* Where the child mounts the tmpfs that becomes QEMU's root: any directory will do (its mount
 * namespace is private by then); the first of these the host has. */
static const char *root_mount_point(void)
{
	static const char *const candidates[] = {"/tmp", "/mnt", "/run", "/var/tmp"};
	struct stat st;
	for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++)
		if (stat(candidates[i], &st) == 0 && S_ISDIR(st.st_mode))
			return candidates[i];
	return NULL;
}

/* Every path made before fork: each file's target under mnt and each directory on the way,
 * parents first, each once. -ENOMEM, -EINVAL (a relative path, "..", too many files) with err. */
static int plan_root(struct sbx_root_plan **out, char *const *files, struct sbx_err *err)
{
	*out = NULL;
	const char *mnt = root_mount_point();
	if (!mnt)
		return sbx_err_set(err, -ENOENT, "no directory to mount QEMU's root on (/tmp, /mnt)");
	unsigned n = 0;
	while (files[n])
		n++;
	if (n > SBX_ROOT_FILES_MAX)
		return sbx_err_set(err, -EINVAL, "%u files for QEMU's root, at most %u", n,
				   SBX_ROOT_FILES_MAX);
	struct sbx_root_plan *p = calloc(1, sizeof(*p));
	if (!p)
		return sbx_err_set(err, -ENOMEM, "out of memory planning QEMU's root");
	/* A path of k components has at most k - 1 parents. */
	size_t maxdirs = 0;
	for (unsigned i = 0; i < n; i++)
		for (const char *c = files[i]; *c; c++)
			maxdirs += *c == '/';
	p->mnt = strdup(mnt);
	p->proc = joined(mnt, "/proc", 5);
	p->dirs = calloc(maxdirs + 1, sizeof(char *));
	p->sources = calloc(n + 1, sizeof(char *));
	p->targets = calloc(n + 1, sizeof(char *));
	if (!p->mnt || !p->proc || !p->dirs || !p->sources || !p->targets)
		goto nomem;
	for (unsigned i = 0; i < n; i++) {
		const char *f = files[i];
		if (f[0] != '/' || strstr(f, "/../") || strstr(f, "/./") || strcmp(f, "/") == 0 ||
		    strncmp(f, "/proc/", 6) == 0 || strcmp(f, "/proc") == 0) {
			free_plan(p);
			return sbx_err_set(err, -EINVAL,
					   "QEMU's root: \"%s\" is not an absolute, plain path "
					   "outside /proc",
					   f);
		}
		int dup = 0;
		for (unsigned k = 0; k < p->nfiles; k++)
			if (strcmp(p->sources[k], f) == 0)
				dup = 1;
		if (dup)
			continue;
		/* Each parent directory of f, shortest first, unless already planned. */
		for (const char *c = strchr(f + 1, '/'); c; c = strchr(c + 1, '/')) {
			char *d = joined(mnt, f, (size_t)(c - f));
			if (!d)
				goto nomem;
			int known = 0;
			for (unsigned k = 0; k < p->ndirs; k++)
				if (strcmp(p->dirs[k], d) == 0)
					known = 1;
			if (known)
				free(d);
			else
				p->dirs[p->ndirs++] = d;
		}
		p->sources[p->nfiles] = strdup(f);
		p->targets[p->nfiles] = joined(mnt, f, strlen(f));
		if (!p->sources[p->nfiles] || !p->targets[p->nfiles]) {
			free(p->sources[p->nfiles]);
			free(p->targets[p->nfiles]);
			p->sources[p->nfiles] = p->targets[p->nfiles] = NULL;
			goto nomem;
		}
		p->nfiles++;
	}
	*out = p;
	return 0;
nomem:
	free_plan(p);
	return sbx_err_set(err, -ENOMEM, "out of memory planning QEMU's root");
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
	j->seccomp = cfg->seccomp;
	int rc = sbx_seccomp_program_for(cfg->seccomp, &j->bpf, &why);
	if (rc == -ENOMEM) {
		*err = why;
		return rc;
	}
	if (rc < 0)
		set_status(j, SBX_LAYER_SECCOMP, 0, "cannot build the filter: %s",
			   sbx_err_text(&why, text, sizeof(text)));
	else
		set_status(j, SBX_LAYER_SECCOMP, 1, "%s filter of %u BPF instructions",
			   sbx_seccomp_policy_names[cfg->seccomp], (unsigned)j->bpf->len);

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

	/* rlimits: no core dumps (they would hold guest memory), no files written (but writable
	 * disks: sbx_jail_allow_file_size), few fds, no locked memory. Address space stays
	 * unlimited: TCG reserves a large code buffer. */
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
	if (cfg->ngroups > SBX_JAIL_GROUPS_MAX || (cfg->ngroups && !cfg->groups))
		return sbx_err_set(err, -EINVAL, "at most %d supplementary groups",
				   SBX_JAIL_GROUPS_MAX);
	char groups[96] = "";
	size_t used = 0;
	for (unsigned i = 0; i < cfg->ngroups; i++) {
		if (cfg->groups[i] < 0 || cfg->groups[i] > 0x7fffffffL)
			return sbx_err_set(err, -EINVAL, "group %ld out of range", cfg->groups[i]);
		j->groups[i] = (unsigned)cfg->groups[i];
		if (used < sizeof(groups))
			used += (size_t)snprintf(groups + used, sizeof(groups) - used, "%s%ld",
						 i ? " " : "", cfg->groups[i]);
	}
	j->ngroups = cfg->ngroups;
	if (cfg->uid < 0)
		set_status(j, SBX_LAYER_USER, 0, "no unprivileged user configured "
						 "(EXEC_SANDBOX_QEMU_USER); QEMU keeps the caller's uid %d",
			   (int)getuid());
	else
		set_status(j, SBX_LAYER_USER, cfg->uid != 0,
			   "uid %ld, gid %ld, groups [%s]%s", cfg->uid,
			   cfg->gid < 0 ? cfg->uid : cfg->gid, groups,
			   cfg->uid ? ", no capabilities (bounding, ambient, inheritable sets empty)"
				    : ": root, with its capabilities");

	/* root: decided here; needs the mount and PID namespaces (sbx_jail_namespaces_refused
	 * turns it off with them) */
	if (!cfg->root_files)
		set_status(j, SBX_LAYER_ROOT, 0, "not asked for: QEMU sees the host's tree (read-only)");
	else {
		struct sbx_root_plan *plan = NULL;
		sbx_err_clear(&why);
		rc = plan_root(&plan, cfg->root_files, &why);
		if (rc == -ENOMEM) {
			*err = why;
			return rc;
		}
		if (rc < 0)
			set_status(j, SBX_LAYER_ROOT, 0, "%s", sbx_err_text(&why, text, sizeof(text)));
		else if (!(j->clone_flags & CLONE_NEWNS) || !(j->clone_flags & CLONE_NEWPID)) {
			free_plan(plan);
			set_status(j, SBX_LAYER_ROOT, 0, "needs the mount and PID namespaces");
		} else {
			j->root = plan;
			set_status(j, SBX_LAYER_ROOT, 1,
				   "pivot_root into a tmpfs holding %u read-only binds and /proc",
				   plan->nfiles);
		}
	}
	return 0;
}

void sbx_jail_allow_file_size(struct sbx_jail *j, uint64_t bytes)
{
	if (!j->enabled)
		return;
	rlim_t lim = bytes > (uint64_t)RLIM_INFINITY - 1 ? RLIM_INFINITY - 1 : (rlim_t)bytes;
	for (int i = 0; i < SBX_JAIL_RLIMITS; i++)
		if (j->rlimits[i].resource == RLIMIT_FSIZE)
			j->rlimits[i].limit = (struct rlimit){lim, lim};
	set_status(j, SBX_LAYER_RLIMITS, 1,
		   "core 0, fsize %llu (writable disks), nofile 1024, memlock 64 KiB",
		   (unsigned long long)lim);
}

void sbx_jail_namespaces_refused(struct sbx_jail *j, int err)
{
	j->clone_flags = 0;
	set_status(j, SBX_LAYER_NAMESPACES, 0, "clone(CLONE_NEW*) refused: %s", strerror(err));
	if (j->root) {
		free_plan(j->root);
		j->root = NULL;
		set_status(j, SBX_LAYER_ROOT, 0, "no mount namespace (clone(CLONE_NEW*) refused)");
	}
}

/* Every capability gone for good: the bounding set (nothing regained through execve), the
 * ambient set, then, once the uid is no longer 0 (which clears the permitted and effective
 * sets), the inheritable set. */
static int drop_bounding_and_ambient(const char **what)
{
	*what = "prctl(PR_CAPBSET_DROP)";
	for (unsigned long cap = 0;; cap++)
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
			if (errno == EINVAL && cap > 0)
				break; /* past the kernel's last capability */
			return -errno;
		}
	*what = "prctl(PR_CAP_AMBIENT_CLEAR_ALL)";
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		return -errno;
	return 0;
}

static int clear_capability_sets(const char **what)
{
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
	memset(data, 0, sizeof(data));
	*what = "capset";
	return syscall(SYS_capset, &hdr, data) < 0 ? -errno : 0;
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
		rc = sbx_ns_setup_child(j->clone_flags, j->read_only_root, j->root, what);
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
	if (j->uid != 0) {
		rc = drop_bounding_and_ambient(what);
		if (rc < 0)
			return rc;
	}
	*what = "setgroups";
	if (syscall(SYS_setgroups, j->ngroups, j->ngroups ? j->groups : NULL) < 0)
		return -errno;
	*what = "setresgid";
	if (syscall(SYS_setresgid, gid, gid, gid) < 0)
		return -errno;
	*what = "setresuid";
	if (syscall(SYS_setresuid, j->uid, j->uid, j->uid) < 0)
		return -errno;
	if (j->uid != 0) {
		rc = clear_capability_sets(what);
		if (rc < 0)
			return rc;
	}
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
	free_plan(j->root);
	j->root = NULL;
	j->bpf = NULL; /* shared, never freed */
	j->enabled = 0;
}
