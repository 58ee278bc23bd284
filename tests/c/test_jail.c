/* The host jail's parts with real processes and real cgroups, without QEMU: /bin/sh stands in for
 * it (spawned exactly as QEMU is). */
#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cgroup.h"
#include "forced_fallbacks.h"
#include "jail.h"
#include "qemu_spawn.h"
#include "test.h"

/* Where a test does not look at the explanation of an error. */
static struct sbx_err E;

static char *const ENVP[] = {"PATH=/usr/bin:/bin", NULL};

/* Run sh -c script under a jail; returns the exit status and what it wrote to stdout. */
static int run_jailed(struct sbx_jail *j, const char *script, char *out, size_t outlen)
{
	int chan[2], con[2];
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan);
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con);
	char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
	struct sbx_spawn_req req = {argv[0], argv, ENVP, chan[1], con[1], j, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
	struct sbx_child c;
	struct sbx_err where = {0};
	int rc = sbx_spawn(&req, &c, &where);
	close(chan[1]);
	close(con[1]);
	if (rc < 0) {
		fprintf(stderr, "spawn: %s: %s\n", where.msg, strerror(-rc));
		close(chan[0]);
		close(con[0]);
		return -1;
	}
	size_t got = 0;
	ssize_t n;
	while (got + 1 < outlen && (n = read(con[0], out + got, outlen - 1 - got)) > 0)
		got += (size_t)n;
	out[got] = 0;
	int st = 0;
	sbx_child_wait(&c, 1, &st);
	close(c.pidfd);
	close(chan[0]);
	close(con[0]);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static struct sbx_jail_config full_config(void)
{
	/* The deny-list: these tests run a shell, whose calls (fork, wait4) QEMU's allow-list
	 * refuses; the allow-list has its own probe (test_seccomp.c). */
	struct sbx_jail_config cfg = {.enabled = 1, .memory_bytes = 64u << 20, .cpu_percent = 50,
				      .pids_max = 16, .uid = -1, .gid = -1,
				      .seccomp = SBX_SECCOMP_DENY_LIST};
	return cfg;
}

static void test_all_layers_in_force(void)
{
	if (sbx_forced_fallbacks.refuse_namespaces)
		SKIP("namespaces refused on purpose (SBX_TEST_FORCE)");
	struct sbx_jail_config cfg = full_config();
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-1", &E), 0);
	for (int l = 0; l < SBX_LAYER__COUNT; l++)
		if (!j.status[l].active)
			fprintf(stderr, "layer %s off: %s\n", sbx_layer_names[l], j.status[l].detail);
	CHECK(j.status[SBX_LAYER_SECCOMP].active);
	CHECK(j.status[SBX_LAYER_NAMESPACES].active);
	CHECK(j.status[SBX_LAYER_CGROUP].active);
	CHECK(!j.status[SBX_LAYER_USER].active); /* none configured: off, with a reason */
	CHECK(strstr(j.status[SBX_LAYER_USER].detail, "no unprivileged user") != NULL);
	char out[4096];
	/* PID 1 of its PID namespace, hostname of its own, no network but lo, seccomp mode 2,
	 * no_new_privs, limits, a read-only root; unshare is denied. */
	int rc = run_jailed(&j,
			    "echo pid=$$; hostname; ls /sys/class/net 2>/dev/null | tr '\\n' ' '; echo;"
			    "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -s '\\t' ' ';"
			    "ulimit -c; ulimit -f; ulimit -n;"
			    "touch /tmp/sbx-jail-probe 2>/dev/null && echo writable || echo read-only;"
			    "grep -c . /proc/self/cgroup >/dev/null; cat /proc/self/cgroup | grep -c sbx-ctest-1",
			    out, sizeof(out));
	CHECK_EQ(rc, 0);
	CHECK(strstr(out, "pid=1\n") != NULL);
	CHECK(strstr(out, "sbx-qemu\n") != NULL);
	CHECK(strstr(out, "Seccomp: 2\n") != NULL);
	CHECK(strstr(out, "NoNewPrivs: 1\n") != NULL);
	CHECK(strstr(out, "\n0\n0\n1024\n") != NULL);
	CHECK(strstr(out, "read-only\n") != NULL);
	CHECK(strstr(out, "\n4\n") != NULL || strstr(out, "\n1\n") != NULL); /* v1: 4 dirs; v2: 1 */
	if (rc != 0 || !strstr(out, "pid=1"))
		fprintf(stderr, "output:\n%s\n", out);
	sbx_jail_finish(&j);
	CHECK(j.usage_valid);
	CHECK(j.cpu_ns != UINT64_MAX);
	CHECK_EQ(j.cg.ndirs, 0); /* removed */
	sbx_jail_destroy(&j);
}

/* The snapshot fds survive the jail: the QMP socket at fd 5, and the RAM file at fd 6, which
 * QEMU opens read-write through /proc/self/fd/6 although the rest of the mount tree is
 * read-only (the magic link leads to the host's open file, not to a path in the jail). Writing
 * with write(2) stays impossible (RLIMIT_FSIZE 0); QEMU writes the RAM through its mapping. */
static void test_snapshot_fds_survive_the_jail(void)
{
	if (sbx_forced_fallbacks.refuse_namespaces)
		SKIP("its read-only mount tree needs namespaces, refused on purpose (SBX_TEST_FORCE)");
	struct sbx_jail_config cfg = full_config();
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-fds", &E), 0);
	char ram_path[] = "/tmp/sbx-ctest-ram-XXXXXX";
	int ram = mkstemp(ram_path);
	CHECK(ram >= 0);
	int chan[2], con[2], qmp[2];
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan);
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con);
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qmp);
	char *argv[] = {"/bin/sh", "-c",
			"[ -e /proc/self/fd/7 ] && echo leak; echo qmp >&5;"
			"{ exec 8<>/proc/self/fd/6; } && echo opened-rw;"
			"touch /tmp/sbx-jail-probe 2>/dev/null && echo writable || echo read-only; exit 0",
			NULL};
	struct sbx_spawn_req req = {argv[0], argv, ENVP, chan[1], con[1], &j, 1, qmp[1], 1, ram, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
	struct sbx_child c;
	CHECK_EQ(sbx_spawn(&req, &c, &E), 0);
	close(chan[1]);
	close(con[1]);
	close(qmp[1]);
	char out[512];
	size_t got = 0;
	ssize_t n;
	while (got + 1 < sizeof(out) && (n = read(con[0], out + got, sizeof(out) - 1 - got)) > 0)
		got += (size_t)n;
	out[got] = 0;
	char q[8] = "";
	CHECK_EQ(read(qmp[0], q, 4), 4);
	CHECK(memcmp(q, "qmp\n", 4) == 0);
	int st = 0;
	sbx_child_wait(&c, 1, &st);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(strstr(out, "opened-rw\n") != NULL);
	CHECK(strstr(out, "read-only\n") != NULL);
	CHECK(strstr(out, "leak") == NULL);
	if (!strstr(out, "opened-rw"))
		fprintf(stderr, "output:\n%s\n", out);
	close(c.pidfd);
	close(chan[0]);
	close(con[0]);
	close(qmp[0]);
	close(ram);
	unlink(ram_path);
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
}

/* A real error of the parent's preparation (not a layer that is off) fills err. */
static void test_prepare_refuses_a_bad_cgroup_name(void)
{
	struct sbx_jail_config cfg = full_config();
	struct sbx_jail j;
	struct sbx_err why = {0};
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "a/b", &why), -EINVAL);
	CHECK(why.code == EINVAL && !why.syscall && strstr(why.msg, "a/b") != NULL);
	sbx_jail_destroy(&j);
}

static void test_cgroup_limits_written_and_removed(void)
{
	struct sbx_cgroup cg;
	struct sbx_cgroup_limits lim = {.memory_bytes = 96u << 20, .cpu_percent = 150, .pids_max = 7};
	struct sbx_err why = {0};
	char text[300];
	int rc = sbx_cgroup_create(&cg, "sbx-ctest-2", &lim, &why);
	if (rc < 0)
		fprintf(stderr, "cgroup: %s\n", sbx_err_text(&why, text, sizeof(text)));
	CHECK_EQ(rc, 0);
	uint64_t v = 0;
	int found_mem = 0, found_pids = 0, found_cpu = 0;
	for (unsigned i = 0; i < cg.ndirs; i++) {
		if (sbx_cgroup_read_u64(cg.dirs[i], "memory.limit_in_bytes", &v, &why) == 0 ||
		    sbx_cgroup_read_u64(cg.dirs[i], "memory.max", &v, &why) == 0) {
			CHECK_EQ(v, 96u << 20);
			found_mem = 1;
		}
		if (sbx_cgroup_read_u64(cg.dirs[i], "pids.max", &v, &why) == 0) {
			CHECK_EQ(v, 7);
			found_pids = 1;
		}
		if (sbx_cgroup_read_u64(cg.dirs[i], "cpu.cfs_quota_us", &v, &why) == 0) {
			CHECK_EQ(v, 150000);
			found_cpu = 1;
		}
	}
	CHECK(found_mem && found_pids && (found_cpu || cg.version == 2));
	/* A file the kernel does not have: the failed open, named; an empty one (no process in
	 * the cgroup yet): no number. */
	CHECK_EQ(sbx_cgroup_read_u64(cg.dirs[0], "no.such.file", &v, &why), -ENOENT);
	CHECK(why.syscall && strcmp(why.msg, "open(no.such.file)") == 0);
	CHECK_EQ(sbx_cgroup_read_u64(cg.dirs[0], "cgroup.procs", &v, &why), -EIO);
	CHECK(!why.syscall && strstr(why.msg, "cgroup.procs is empty") != NULL);
	char first[PATH_MAX];
	snprintf(first, sizeof(first), "%s", cg.dirs[0]);
	sbx_cgroup_remove(&cg);
	struct stat sb;
	CHECK(stat(first, &sb) < 0 && errno == ENOENT);
}

/* A jail whose namespaces are refused still runs, with the reason recorded. */
static void test_namespaces_refused_is_recorded(void)
{
	struct sbx_jail_config cfg = full_config();
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-3", &E), 0);
	sbx_jail_namespaces_refused(&j, EPERM);
	CHECK(!j.status[SBX_LAYER_NAMESPACES].active);
	CHECK(strstr(j.status[SBX_LAYER_NAMESPACES].detail, "refused") != NULL);
	char out[256];
	CHECK_EQ(run_jailed(&j, "test $$ -ne 1", out, sizeof(out)), 0);
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
}

/* The child makes its own cgroup between fork and exec; when it cannot (here: the directory
 * exists already), QEMU still runs, outside any cgroup, and the layer is off with the reason. */
static void test_cgroup_the_child_cannot_make_is_off_with_its_reason(void)
{
	struct sbx_jail_config cfg = full_config();
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-8", &E), 0);
	CHECK(j.status[SBX_LAYER_CGROUP].active && j.cg.ndirs > 0);
	CHECK_EQ(mkdir(j.cg.dirs[0], 0700), 0);
	char out[256];
	CHECK_EQ(run_jailed(&j, "cat /proc/self/cgroup | grep -c sbx-ctest-8", out, sizeof(out)), 1);
	CHECK_STR(out, "0\n");
	CHECK(!j.status[SBX_LAYER_CGROUP].active);
	CHECK(strstr(j.status[SBX_LAYER_CGROUP].detail, "mkdir(cgroup)") != NULL);
	CHECK(strstr(j.status[SBX_LAYER_CGROUP].detail, "File exists") != NULL);
	char first[PATH_MAX];
	snprintf(first, sizeof(first), "%s", j.cg.dirs[0]);
	sbx_jail_finish(&j);
	CHECK(!j.usage_valid);
	struct stat sb;
	CHECK(stat(first, &sb) < 0 && errno == ENOENT); /* removed all the same */
	sbx_jail_destroy(&j);
}

static void test_network_vm_keeps_host_netns(void)
{
	struct sbx_jail_config cfg = full_config();
	cfg.network = 1;
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-4", &E), 0);
	char out[512], self[64] = "";
	ssize_t n = readlink("/proc/self/ns/net", self, sizeof(self) - 1);
	CHECK(n > 0);
	CHECK_EQ(run_jailed(&j, "readlink /proc/self/ns/net", out, sizeof(out)), 0);
	out[strcspn(out, "\n")] = 0;
	CHECK_STR(out, self);
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
}

static void test_unprivileged_user(void)
{
	struct sbx_jail_config cfg = full_config();
	cfg.uid = 65534;
	cfg.gid = 65534;
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-5", &E), 0);
	CHECK(j.status[SBX_LAYER_USER].active);
	char out[256];
	CHECK_EQ(run_jailed(&j, "id -u; id -g; id -G", out, sizeof(out)), 0);
	CHECK_STR(out, "65534\n65534\n65534\n");
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
}

/* /bin/sh and the libraries the loader maps for it (ldd's list), for a root of its own. */
static unsigned shell_files(char **files, unsigned max)
{
	unsigned n = 0;
	files[n++] = strdup("/bin/sh");
	FILE *f = popen("ldd /bin/sh", "r");
	char line[512];
	while (f && fgets(line, sizeof(line), f) && n + 2 < max) {
		char *slash = strchr(line, '/');
		if (!slash)
			continue;
		slash[strcspn(slash, " (\n")] = 0;
		files[n++] = strdup(slash);
	}
	if (f)
		pclose(f);
	files[n++] = strdup("/dev/null");
	files[n] = NULL;
	return n;
}

/* QEMU's own root and user, seen from inside: a root holding only the bound files and /proc (no
 * /etc, /home, /root, /tmp), read-only; uid and gid 65534 with the one supplementary group asked
 * for; every capability set empty. Builtins only: nothing else is in that root. */
static void test_own_root_unprivileged_without_capabilities(void)
{
	if (sbx_forced_fallbacks.refuse_namespaces)
		SKIP("the root needs namespaces, refused on purpose (SBX_TEST_FORCE)");
	if (geteuid() != 0)
		SKIP("switching users needs root");
	char *files[64];
	unsigned nfiles = shell_files(files, 64);
	long groups[] = {65533};
	struct sbx_jail_config cfg = full_config();
	cfg.uid = 65534;
	cfg.gid = 65534;
	cfg.groups = groups;
	cfg.ngroups = 1;
	cfg.root_files = files;
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-root", &E), 0);
	CHECK(j.status[SBX_LAYER_ROOT].active);
	CHECK(j.status[SBX_LAYER_USER].active);
	CHECK(strstr(j.status[SBX_LAYER_USER].detail, "no capabilities") != NULL);
	char out[4096];
	int rc = run_jailed(&j,
			    "echo /* /.*;"
			    "while read -r k v; do case $k in Uid:|Gid:|Groups:|Cap*) echo $k $v;;"
			    " esac; done < /proc/self/status;"
			    "[ -e /etc/shadow ] && echo shadow || echo no-shadow;"
			    "(echo x > /bin/sbx-probe) 2>/dev/null && echo writable || echo read-only;"
			    "[ -e /proc/1/status ] && echo proc",
			    out, sizeof(out));
	CHECK_EQ(rc, 0);
	/* the root's entries: only the bound files' top directories and /proc */
	char top[256] = "";
	size_t toplen = strcspn(out, "\n");
	memcpy(top, out, toplen < sizeof(top) - 1 ? toplen : sizeof(top) - 1);
	CHECK(strstr(top, "/bin ") != NULL);
	CHECK(strstr(top, "/proc") != NULL);
	CHECK(strstr(top, "/dev") != NULL);
	CHECK(strstr(top, "/etc") == NULL);
	CHECK(strstr(top, "/home") == NULL);
	CHECK(strstr(top, "/root") == NULL);
	CHECK(strstr(top, "/tmp") == NULL);
	CHECK(strstr(out, "Uid: 65534 65534 65534 65534\n") != NULL);
	CHECK(strstr(out, "Gid: 65534 65534 65534 65534\n") != NULL);
	CHECK(strstr(out, "Groups: 65533\n") != NULL);
	CHECK(strstr(out, "CapInh: 0000000000000000\n") != NULL);
	CHECK(strstr(out, "CapPrm: 0000000000000000\n") != NULL);
	CHECK(strstr(out, "CapEff: 0000000000000000\n") != NULL);
	CHECK(strstr(out, "CapBnd: 0000000000000000\n") != NULL);
	CHECK(strstr(out, "CapAmb: 0000000000000000\n") != NULL);
	CHECK(strstr(out, "no-shadow\n") != NULL);
	CHECK(strstr(out, "read-only\n") != NULL);
	CHECK(strstr(out, "proc") != NULL);
	if (rc != 0 || !strstr(out, "no-shadow"))
		fprintf(stderr, "output:\n%s\n", out);
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
	for (unsigned i = 0; i < nfiles; i++)
		free(files[i]);
}

/* A root that cannot be made (a file that does not exist) fails the spawn with the step named,
 * rather than starting QEMU in the host's tree. */
static void test_missing_root_file_fails_the_spawn(void)
{
	if (sbx_forced_fallbacks.refuse_namespaces)
		SKIP("the root needs namespaces, refused on purpose (SBX_TEST_FORCE)");
	char *files[] = {"/bin/sh", "/nonexistent-sbx-file", NULL};
	struct sbx_jail_config cfg = full_config();
	cfg.root_files = files;
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-noroot", &E), 0);
	char out[256];
	CHECK_EQ(run_jailed(&j, "echo ran", out, sizeof(out)), -1);
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
	/* and a relative path is refused when planned: the layer is off with the reason */
	char *relative[] = {"bin/sh", NULL};
	cfg.root_files = relative;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-noroot", &E), 0);
	CHECK(!j.status[SBX_LAYER_ROOT].active);
	CHECK(strstr(j.status[SBX_LAYER_ROOT].detail, "absolute") != NULL);
	sbx_jail_destroy(&j);
}

/* The user switch clears PR_SET_PDEATHSIG; the child re-arms it. A middle process spawns a jailed
 * `sleep` as nobody and exits: as subreaper we inherit the orphan and must see it die of SIGKILL. */
static void test_parent_death_kills_child_after_user_switch(void)
{
	CHECK_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
	int p[2];
	CHECK_EQ(pipe(p), 0);
	pid_t middle = fork();
	if (middle == 0) {
		/* No limits: no cgroup, which this process could not remove after its exit. */
		struct sbx_jail_config cfg = {.enabled = 1, .uid = 65534, .gid = 65534,
					      .seccomp = SBX_SECCOMP_DENY_LIST};
		struct sbx_jail j;
		if (sbx_jail_prepare(&j, &cfg, "sbx-ctest-6", &E) < 0)
			_exit(2);
		char *const argv[] = {"/bin/sleep", "30", NULL};
		int chan[2], con[2];
		socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan);
		socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con);
		struct sbx_spawn_req req = {argv[0], argv, ENVP, chan[1], con[1], &j, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
		struct sbx_child c;
		pid_t pid = sbx_spawn(&req, &c, &E) == 0 ? c.pid : -1;
		if (write(p[1], &pid, sizeof(pid)) != sizeof(pid))
			_exit(2);
		_exit(0);
	}
	close(p[1]);
	pid_t grandchild = -1;
	CHECK_EQ(read(p[0], &grandchild, sizeof(grandchild)), (ssize_t)sizeof(grandchild));
	close(p[0]);
	CHECK(grandchild > 0);
	int st;
	CHECK_EQ(waitpid(middle, &st, 0), middle);
	if (grandchild > 0) {
		alarm(10);
		pid_t r = waitpid(grandchild, &st, 0);
		alarm(0);
		CHECK_EQ(r, grandchild);
		CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	}
	prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
}

/* Thread churn for the test below: each thread creates and joins short-lived threads until told
 * to stop, so that at any moment some thread of this process is likely inside pthread_create or
 * thread exit (holding glibc's stack-list lock, or owning a not-yet-started thread). */
static volatile int churn_stop;

static void *churn_nothing(void *arg)
{
	return arg;
}

static void *churn(void *arg)
{
	(void)arg;
	while (!churn_stop) {
		pthread_t t;
		if (pthread_create(&t, NULL, churn_nothing, NULL) == 0)
			pthread_join(t, NULL);
	}
	return NULL;
}

/* The worker of the test below, in its own process: spawns `rounds` jailed children that switch
 * to nobody while other threads churn. Exit status: 0 all spawned and exited 0, 1 otherwise. */
static int spawn_as_nobody_while_threads_churn(int rounds)
{
	/* Namespaces on (the raw clone path), no limits (no cgroup to create and remove per round). */
	struct sbx_jail_config cfg = {.enabled = 1, .uid = 65534, .gid = 65534,
					      .seccomp = SBX_SECCOMP_DENY_LIST};
	struct sbx_jail j;
	if (sbx_jail_prepare(&j, &cfg, "sbx-ctest-7", &E) < 0 || !j.clone_flags)
		return 1;
	pthread_t threads[4];
	for (int i = 0; i < 4; i++)
		if (pthread_create(&threads[i], NULL, churn, NULL) != 0)
			return 1;
	int bad = 0;
	for (int i = 0; i < rounds && !bad; i++) {
		char *const argv[] = {"/bin/true", NULL};
		int chan[2], con[2];
		socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan);
		socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con);
		struct sbx_spawn_req req = {argv[0], argv, ENVP, chan[1], con[1], &j, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
		struct sbx_child c;
		struct sbx_err where = {0};
		int rc = sbx_spawn(&req, &c, &where);
		if (rc < 0) {
			fprintf(stderr, "round %d: spawn: %s: %s\n", i, where.msg, strerror(-rc));
			bad = 1;
		} else {
			int st = 0;
			sbx_child_wait(&c, 1, &st);
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
				fprintf(stderr, "round %d: child status %#x\n", i, st);
				bad = 1;
			}
			if (c.pidfd >= 0)
				close(c.pidfd);
		}
		close(chan[0]);
		close(chan[1]);
		close(con[0]);
		close(con[1]);
	}
	churn_stop = 1;
	for (int i = 0; i < 4; i++)
		pthread_join(threads[i], NULL);
	sbx_jail_destroy(&j);
	return bad;
}

/* The user switch happens in a child made by a raw clone() (the namespaces path), so glibc in the
 * child still believes the parent's threads exist. glibc's setgroups/setresgid/setresuid in a
 * "multi-threaded" process go through its all-threads setxid machinery: take the stack-list lock
 * and wait for every listed thread, including one that another thread was creating at the time of
 * the clone, which no one will ever finish in the child. The child must make the raw syscalls.
 * Without that this test hangs (a child stuck before execve holds the error pipe open, so
 * sbx_spawn never returns): the worker runs in its own process, and a watchdog far above the
 * normal run time (a few seconds) turns a hang into a failure instead of a stuck test run. */
static void test_user_switch_while_other_threads_churn(void)
{
	pid_t worker = fork();
	if (worker == 0)
		_exit(spawn_as_nobody_while_threads_churn(300));
	CHECK(worker > 0);
	if (worker <= 0)
		return;
	int pidfd = (int)syscall(SYS_pidfd_open, worker, 0); /* the test's own, never forced off */
	CHECK(pidfd >= 0);
	struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
	int ready = poll(&pfd, 1, 120 * 1000);
	if (ready != 1) {
		fprintf(stderr, "worker hung: a child deadlocked before execve (glibc setxid?)\n");
		kill(worker, SIGKILL); /* its children die with it (PR_SET_PDEATHSIG) */
	}
	CHECK_EQ(ready, 1);
	int st = 0;
	CHECK_EQ(waitpid(worker, &st, 0), worker);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(pidfd);
}

/* A kernel that refuses clone(CLONE_NEW*) (e.g. unprivileged user namespaces off): spawn falls
 * back to a plain fork, QEMU runs outside new namespaces, and the layer says why. */
static void test_namespaces_refused_by_clone_fall_back_to_fork(void)
{
	struct sbx_forced_fallbacks saved = sbx_forced_fallbacks;
	sbx_forced_fallbacks.refuse_namespaces = 1;
	struct sbx_jail_config cfg = full_config();
	struct sbx_jail j;
	CHECK_EQ(sbx_jail_prepare(&j, &cfg, "sbx-ctest-9", &E), 0);
	CHECK(j.status[SBX_LAYER_NAMESPACES].active); /* planned ... */
	char out[256];
	CHECK_EQ(run_jailed(&j, "test $$ -ne 1", out, sizeof(out)), 0); /* ... not PID 1 */
	CHECK(!j.status[SBX_LAYER_NAMESPACES].active); /* ... and off, with clone's reason */
	CHECK(strstr(j.status[SBX_LAYER_NAMESPACES].detail, "refused: Operation not permitted"));
	CHECK(j.status[SBX_LAYER_SECCOMP].active); /* the other layers hold */
	sbx_jail_finish(&j);
	sbx_jail_destroy(&j);
	sbx_forced_fallbacks = saved;
}

int main(void)
{
	const char *name = force_fallbacks_from_env("test_jail");
	if (geteuid() != 0)
		SKIP_ALL("needs root for cgroups and namespaces");
	RUN(test_all_layers_in_force);
	RUN(test_snapshot_fds_survive_the_jail);
	RUN(test_cgroup_limits_written_and_removed);
	RUN(test_prepare_refuses_a_bad_cgroup_name);
	RUN(test_namespaces_refused_is_recorded);
	RUN(test_namespaces_refused_by_clone_fall_back_to_fork);
	RUN(test_cgroup_the_child_cannot_make_is_off_with_its_reason);
	RUN(test_network_vm_keeps_host_netns);
	RUN(test_unprivileged_user);
	RUN(test_own_root_unprivileged_without_capabilities);
	RUN(test_missing_root_file_fails_the_spawn);
	RUN(test_parent_death_kills_child_after_user_switch);
	RUN(test_user_switch_while_other_threads_churn);
	TEST_MAIN_END(name);
}
