/* See cgroup.h. Only the parent touches cgroup files: the child is moved in while it waits on the
 * spawn's go pipe, before it execs QEMU. */
#define _GNU_SOURCE 1
#include "cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"

#define CGROUP_ROOT "/sys/fs/cgroup"
#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif
#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

int sbx_cgroup_read_u64(const char *dir, const char *file, uint64_t *out, struct sbx_err *err)
{
	char path[PATH_MAX + 64], buf[64];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
		return sbx_err_set(err, -ENAMETOOLONG, "cgroup file path too long: %s", file);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sbx_err_sys(err, -errno, "open(%s)", file);
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	if (n < 0)
		return sbx_err_sys(err, -errno, "read(%s)", file);
	if (n == 0)
		return sbx_err_set(err, -EIO, "cgroup file %s is empty", file);
	buf[n] = 0;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(buf, &end, 10);
	if (errno || end == buf)
		return sbx_err_set(err, -EIO, "cgroup file %s holds no number", file);
	*out = v;
	return 0;
}

/* "usage_usec 1234" in cgroup v2's cpu.stat. */
static int read_v2_cpu_usec(const char *dir, uint64_t *out)
{
	char path[PATH_MAX + 64];
	snprintf(path, sizeof(path), "%s/cpu.stat", dir);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	char key[64];
	unsigned long long v;
	int rc = -ENOENT;
	while (fscanf(f, "%63s %llu", key, &v) == 2)
		if (strcmp(key, "usage_usec") == 0) {
			*out = v;
			rc = 0;
			break;
		}
	fclose(f);
	return rc;
}

static int is_fs(const char *path, long magic)
{
	struct statfs sf;
	return statfs(path, &sf) == 0 && (long)sf.f_type == magic;
}

/* This process's cgroup path for a v1 controller (or "" for the v2 line "0::") from
 * /proc/self/cgroup. 0 or -ENOENT. */
static int own_cgroup(const char *controller, char *out, size_t len)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return -errno;
	char line[PATH_MAX + 128];
	int rc = -ENOENT;
	while (fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = 0;
		char *list = c1 + 1, *path = c2 + 1;
		path[strcspn(path, "\n")] = 0;
		int match = 0;
		if (!controller[0]) {
			match = list[0] == 0;
		} else {
			char *save = NULL;
			for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
				if (strcmp(tok, controller) == 0)
					match = 1;
		}
		if (match) {
			snprintf(out, len, "%s", path);
			rc = 0;
			break;
		}
	}
	fclose(f);
	return rc;
}

static int dir_path(char *dst, const char *mount, const char *own, const char *name)
{
	int n = snprintf(dst, PATH_MAX, "%s%s%s/%s", mount, own[0] == '/' ? "" : "/",
			 strcmp(own, "/") == 0 ? "" : own, name);
	if (n < 0 || n >= PATH_MAX)
		return -ENAMETOOLONG;
	return 0;
}

static void rmdir_retry(const char *dir)
{
	/* A reaped task may still be leaving its cgroup (a large address space being torn down
	 * under load): back off from 1 ms up to 2 s in all. The first try succeeds normally. */
	long wait_us = 1000, waited_us = 0;
	for (;;) {
		if (rmdir(dir) == 0 || errno == ENOENT || errno != EBUSY || waited_us >= 2000000)
			return;
		struct timespec ts = {0, wait_us * 1000};
		nanosleep(&ts, NULL);
		waited_us += wait_us;
		wait_us = wait_us * 2 > 200000 ? 200000 : wait_us * 2;
	}
}

/* A caller that was SIGKILLed could not remove its VMs' cgroups (QEMU died with it through
 * PDEATHSIG, so they are empty). Remove the siblings named by jail.c's scheme "sbx-<pid>-<n>"
 * whose pid no longer exists; a populated one refuses (EBUSY) and stays. */
static void sweep_stale(const char *dir)
{
	char parent[PATH_MAX];
	snprintf(parent, sizeof(parent), "%s", dir);
	char *slash = strrchr(parent, '/');
	if (!slash || slash == parent)
		return;
	*slash = 0;
	DIR *d = opendir(parent);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		int pid;
		unsigned long n;
		char tail;
		if (sscanf(e->d_name, "sbx-%d-%lu%c", &pid, &n, &tail) != 2 || pid <= 0 ||
		    pid == (int)getpid())
			continue;
		if (kill(pid, 0) == 0 || errno != ESRCH)
			continue; /* alive (or not ours to judge) */
		char path[2 * PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", parent, e->d_name);
		rmdir(path);
	}
	closedir(d);
}

/* A limit file to write into dirs[dir] (by the child, sbx_cgroup_materialize). */
__attribute__((format(printf, 5, 6))) static int plan_write(struct sbx_cgroup *cg, unsigned dir,
							    const char *file, int optional,
							    const char *fmt, ...)
{
	if (cg->nwrites >= SBX_CGROUP_MAX_WRITES)
		return -E2BIG;
	struct sbx_cgroup_write *w = &cg->writes[cg->nwrites++];
	w->dir = dir;
	w->optional = optional;
	snprintf(w->file, sizeof(w->file), "%s", file);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->value, sizeof(w->value), fmt, ap);
	va_end(ap);
	return 0;
}

static int plan_v2(struct sbx_cgroup *cg, const char *name, const struct sbx_cgroup_limits *lim,
		   struct sbx_err *err)
{
	char own[PATH_MAX], mount[2 * PATH_MAX];
	const char *m = NULL;
	if (is_fs(CGROUP_ROOT, CGROUP2_SUPER_MAGIC))
		m = CGROUP_ROOT;
	else if (is_fs(CGROUP_ROOT "/unified", CGROUP2_SUPER_MAGIC))
		m = CGROUP_ROOT "/unified";
	if (!m || own_cgroup("", own, sizeof(own)) < 0)
		return sbx_err_set(err, -ENOTSUP, "no cgroup2 hierarchy");
	snprintf(mount, sizeof(mount), "%s%s/cgroup.subtree_control", m,
		 strcmp(own, "/") == 0 ? "" : own);
	char ctl[256] = "";
	FILE *f = fopen(mount, "re");
	if (f) {
		if (!fgets(ctl, sizeof(ctl), f))
			ctl[0] = 0;
		fclose(f);
	}
	/* Delegated: the controllers are enabled for this cgroup's children. */
	if (!strstr(ctl, "memory") || !strstr(ctl, "cpu") || !strstr(ctl, "pids"))
		return sbx_err_set(err, -ENOTSUP, "cgroup v2 at %s: memory/cpu/pids not delegated to %s",
			    m, own);
	int rc = dir_path(cg->dirs[0], m, own, name);
	if (rc < 0)
		return sbx_err_set(err, rc, "cgroup v2: path under %s: %s", own, strerror(-rc));
	cg->ndirs = 1;
	cg->version = 2;
	cg->has_memory = cg->has_cpu = cg->has_cpuacct = cg->has_pids = 1;
	if (lim->memory_bytes && ((rc = plan_write(cg, 0, "memory.max", 0, "%llu",
						   (unsigned long long)lim->memory_bytes)) < 0 ||
				  (rc = plan_write(cg, 0, "memory.swap.max", 0, "0")) < 0))
		return sbx_err_set(err, rc, "cgroup v2: too many limits");
	if (lim->cpu_percent &&
	    (rc = plan_write(cg, 0, "cpu.max", 0, "%llu 100000", lim->cpu_percent * 1000ull)) < 0)
		return sbx_err_set(err, rc, "cgroup v2: too many limits");
	if (lim->pids_max && (rc = plan_write(cg, 0, "pids.max", 0, "%u", lim->pids_max)) < 0)
		return sbx_err_set(err, rc, "cgroup v2: too many limits");
	return 0;
}

static const char *const v1_controllers[SBX_CGROUP_MAX_DIRS] = {"memory", "cpu", "cpuacct",
								  "pids"};

static int plan_v1(struct sbx_cgroup *cg, const char *name, const struct sbx_cgroup_limits *lim,
		   struct sbx_err *err)
{
	int *has[SBX_CGROUP_MAX_DIRS] = {&cg->has_memory, &cg->has_cpu, &cg->has_cpuacct,
					 &cg->has_pids};
	unsigned at[SBX_CGROUP_MAX_DIRS]; /* the directory of each controller */
	cg->version = 1;
	for (unsigned i = 0; i < SBX_CGROUP_MAX_DIRS; i++) {
		char mount[PATH_MAX], own[PATH_MAX], real[PATH_MAX];
		snprintf(mount, sizeof(mount), CGROUP_ROOT "/%s", v1_controllers[i]);
		if (!is_fs(mount, CGROUP_SUPER_MAGIC) || own_cgroup(v1_controllers[i], own, sizeof(own)) < 0)
			return sbx_err_set(err, -ENOTSUP, "no cgroup v1 %s controller mounted at %s",
				    v1_controllers[i], mount);
		/* cpu and cpuacct are often one hierarchy ("cpu,cpuacct"): one directory then. */
		if (!realpath(mount, real))
			snprintf(real, sizeof(real), "%s", mount);
		char dir[PATH_MAX];
		int n = snprintf(dir, sizeof(dir), "%s%s/%s", real, strcmp(own, "/") == 0 ? "" : own,
				 name);
		if (n < 0 || n >= PATH_MAX)
			return sbx_err_set(err, -ENAMETOOLONG, "cgroup path too long");
		*has[i] = 1;
		at[i] = cg->ndirs;
		for (unsigned j = 0; j < cg->ndirs; j++)
			if (strcmp(cg->dirs[j], dir) == 0)
				at[i] = j;
		if (at[i] == cg->ndirs)
			memcpy(cg->dirs[cg->ndirs++], dir, sizeof(dir));
	}
	int rc = 0;
	if (lim->memory_bytes) {
		/* memory+swap: the same figure, so swap is no way around the limit (absent when the
		 * kernel has no swap accounting: optional). */
		if ((rc = plan_write(cg, at[0], "memory.limit_in_bytes", 0, "%llu",
				     (unsigned long long)lim->memory_bytes)) < 0 ||
		    (rc = plan_write(cg, at[0], "memory.memsw.limit_in_bytes", 1, "%llu",
				     (unsigned long long)lim->memory_bytes)) < 0)
			return sbx_err_set(err, rc, "cgroup v1: too many limits");
	}
	if (lim->cpu_percent &&
	    ((rc = plan_write(cg, at[1], "cpu.cfs_period_us", 0, "100000")) < 0 ||
	     (rc = plan_write(cg, at[1], "cpu.cfs_quota_us", 0, "%llu", lim->cpu_percent * 1000ull)) <
		     0))
		return sbx_err_set(err, rc, "cgroup v1: too many limits");
	if (lim->pids_max && (rc = plan_write(cg, at[3], "pids.max", 0, "%u", lim->pids_max)) < 0)
		return sbx_err_set(err, rc, "cgroup v1: too many limits");
	return 0;
}

int sbx_cgroup_plan(struct sbx_cgroup *cg, const char *name, const struct sbx_cgroup_limits *lim,
		    struct sbx_err *err)
{
	struct sbx_err v2 = {0};
	memset(cg, 0, sizeof(*cg));
	if (plan_v2(cg, name, lim, &v2) == 0)
		return 0;
	memset(cg, 0, sizeof(*cg));
	int rc = plan_v1(cg, name, lim, err);
	if (rc == 0)
		return 0;
	memset(cg, 0, sizeof(*cg));
	/* Why neither: v1's reason, then v2's. */
	char t1[sizeof(err->msg)], t2[sizeof(v2.msg)];
	return sbx_err_set(err, rc, "%s; %s", sbx_err_text(err, t1, sizeof(t1)),
			   sbx_err_text(&v2, t2, sizeof(t2)));
}

/* Async-signal-safe: only syscalls on strings prepared by sbx_cgroup_plan. */
static int write_at(int dfd, const char *file, const char *text)
{
	int fd = openat(dfd, file, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t n = strlen(text);
	ssize_t w = write(fd, text, n);
	int err = w < 0 ? errno : (size_t)w == n ? 0 : EIO;
	close(fd);
	return -err;
}

int sbx_cgroup_materialize(const struct sbx_cgroup *cg, int enter, const char **what)
{
	for (unsigned i = 0; i < cg->ndirs; i++) {
		*what = "mkdir(cgroup)";
		if (mkdir(cg->dirs[i], 0700) < 0)
			return -errno;
		*what = "open(cgroup)";
		int dfd = open(cg->dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			return -errno;
		int rc = 0;
		*what = "write(cgroup limit)";
		for (unsigned k = 0; rc == 0 && k < cg->nwrites; k++) {
			const struct sbx_cgroup_write *w = &cg->writes[k];
			if (w->dir != i)
				continue;
			rc = write_at(dfd, w->file, w->value);
			if (rc == -ENOENT && w->optional)
				rc = 0;
		}
		if (rc == 0 && enter) {
			/* "0": the writing process itself (also from inside a new PID namespace). */
			*what = "write(cgroup.procs)";
			rc = write_at(dfd, "cgroup.procs", "0");
		}
		close(dfd);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int sbx_cgroup_create(struct sbx_cgroup *cg, const char *name, const struct sbx_cgroup_limits *lim,
		      struct sbx_err *err)
{
	int rc = sbx_cgroup_plan(cg, name, lim, err);
	if (rc < 0)
		return rc;
	const char *what = "cgroup";
	rc = sbx_cgroup_materialize(cg, 0, &what);
	if (rc < 0) {
		sbx_cgroup_remove(cg);
		return sbx_err_sys(err, rc, "cgroup v%d: %s", cg->version, what);
	}
	return 0;
}

void sbx_cgroup_usage(const struct sbx_cgroup *cg, uint64_t *cpu_ns, uint64_t *memory_peak)
{
	struct sbx_err absent = {0}; /* a figure the kernel does not keep is UINT64_MAX, not an error */
	*cpu_ns = UINT64_MAX;
	*memory_peak = UINT64_MAX;
	if (cg->version == 2) {
		uint64_t us;
		if (read_v2_cpu_usec(cg->dirs[0], &us) == 0)
			*cpu_ns = us * 1000;
		if (sbx_cgroup_read_u64(cg->dirs[0], "memory.peak", memory_peak, &absent) < 0)
			*memory_peak = UINT64_MAX;
		return;
	}
	for (unsigned i = 0; i < cg->ndirs; i++) {
		uint64_t v;
		if (*cpu_ns == UINT64_MAX &&
		    sbx_cgroup_read_u64(cg->dirs[i], "cpuacct.usage", &v, &absent) == 0)
			*cpu_ns = v;
		if (*memory_peak == UINT64_MAX &&
		    sbx_cgroup_read_u64(cg->dirs[i], "memory.max_usage_in_bytes", &v, &absent) == 0)
			*memory_peak = v;
	}
}

void sbx_cgroup_remove(struct sbx_cgroup *cg)
{
	for (unsigned i = cg->ndirs; i-- > 0;) {
		rmdir_retry(cg->dirs[i]);
		sweep_stale(cg->dirs[i]);
	}
	cg->ndirs = 0;
	cg->nwrites = 0;
	cg->version = 0;
}
