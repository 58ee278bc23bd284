/* Tests of fork+exec (qemu_spawn.c) with real children: /bin/sh and /bin/sleep stand in for QEMU. */
#define _GNU_SOURCE 1
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "forced_fallbacks.h"
#include "qemu_spawn.h"
#include "test.h"

/* Where a test does not look at the explanation of an error. */
static struct sbx_err E;

static char *const ENVP[] = {"PATH=/usr/bin:/bin", NULL};

struct pair {
	int host, child;
};

/* Both ends moved to fds >= 20, so that tests can place copies at 0..4 without clobbering. */
static int high(int fd)
{
	int h = fcntl(fd, F_DUPFD_CLOEXEC, 20);
	close(fd);
	return h;
}

static struct pair mkpair(void)
{
	int sv[2] = {-1, -1};
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
	return (struct pair){high(sv[0]), high(sv[1])};
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Spawn argv with fresh channel/console pairs; the child ends are closed afterwards. */
static int spawn_argv(char *const argv[], struct sbx_child *c, struct pair *chan, struct pair *con,
		      struct sbx_err *where)
{
	*chan = mkpair();
	*con = mkpair();
	struct sbx_spawn_req req = {argv[0], argv, ENVP, chan->child, con->child, NULL, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
	int rc = sbx_spawn(&req, c, where);
	close(chan->child);
	close(con->child);
	return rc;
}

static void reap(struct sbx_child *c, int *status)
{
	int st = 0;
	CHECK_EQ(sbx_child_wait(c, 1, &st), 1);
	if (status)
		*status = st;
	if (c->pidfd >= 0)
		close(c->pidfd);
}

/* Read until EOF (blocking fd). */
static size_t read_all(int fd, char *buf, size_t cap)
{
	size_t got = 0;
	for (;;) {
		ssize_t n = read(fd, buf + got, cap - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	buf[got] = 0;
	return got;
}

/* The value of "Field:" in /proc/<pid>/status, or "" */
static void status_field(pid_t pid, const char *field, char *out, size_t cap)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	out[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	size_t fl = strlen(field);
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
			char *v = line + fl + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			v[strcspn(v, "\n")] = 0;
			snprintf(out, cap, "%s", v);
			break;
		}
	}
	fclose(f);
}

/* Bitmask of the child's open fds below 64, plus 1<<63 if any fd >= 63. */
static unsigned long long open_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return ~0ull;
	unsigned long long mask = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		int fd = atoi(e->d_name);
		mask |= fd >= 63 ? 1ull << 63 : 1ull << fd;
	}
	closedir(d);
	return mask;
}

static ino_t fd_ino(pid_t pid, int fd)
{
	char path[64];
	struct stat st;
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
	return stat(path, &st) == 0 ? st.st_ino : 0;
}

static ino_t my_ino(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

static void test_exec_failure_enoent(void)
{
	char *const argv[] = {"/nonexistent/qemu-system-x86_64", "-M", "microvm", NULL};
	struct sbx_child c = {123, 456};
	struct pair chan, con;
	struct sbx_err where = {0};
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &where), -ENOENT);
	CHECK_STR(where.msg, "execve");
	CHECK_EQ(c.pid, -1);
	CHECK_EQ(c.pidfd, -1);
	/* The failed child was reaped: no zombie left for us. */
	CHECK_EQ(waitpid(-1, NULL, WNOHANG), -1);
	CHECK_EQ(errno, ECHILD);
	close(chan.host);
	close(con.host);
}

static void test_exec_failure_eacces(void)
{
	char tmpl[] = "/tmp/sbx-test-XXXXXX";
	int fd = mkstemp(tmpl);
	CHECK(fd >= 0);
	CHECK_EQ(write(fd, "#!/bin/sh\n", 10), 10);
	close(fd);
	chmod(tmpl, 0600);
	char *const argv[] = {tmpl, NULL};
	struct sbx_child c;
	struct pair chan, con;
	struct sbx_err where = {0};
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &where), -EACCES);
	CHECK_STR(where.msg, "execve");
	unlink(tmpl);
	close(chan.host);
	close(con.host);
}

/* sbx_spawn_start returns after the fork: an exec failure is not its return value but what
 * sbx_spawn_finish reads once the error pipe is readable; the failed child is still to reap. */
static void test_start_reports_the_exec_through_the_error_pipe(void)
{
	char *const missing[] = {"/nonexistent/qemu", NULL};
	char *const ok[] = {"/bin/true", NULL};
	char *const *argvs[] = {missing, ok};
	for (int i = 0; i < 2; i++) {
		struct pair chan = mkpair(), con = mkpair();
		struct sbx_spawn_req req = {argvs[i][0], argvs[i], ENVP, chan.child, con.child,
					    NULL, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
		struct sbx_child c;
		struct sbx_spawn_pending p;
		struct sbx_err where = {0};
		CHECK_EQ(sbx_spawn_start(&req, &c, &p, &where), 0);
		close(chan.child);
		close(con.child);
		CHECK(c.pid > 0 && p.err_fd >= 0 && p.go_fd >= 0);
		CHECK_EQ(c.pidfd >= 0, !sbx_forced_fallbacks.no_pidfd);
		struct pollfd pfd = {.fd = p.err_fd, .events = POLLIN};
		CHECK_EQ(poll(&pfd, 1, 10000), 1);
		int rc = sbx_spawn_finish(&p, 0, &where);
		CHECK(p.err_fd == -1 && p.go_fd == -1);
		int st;
		reap(&c, &st);
		if (i == 0) {
			CHECK_EQ(rc, -ENOENT);
			CHECK_STR(where.msg, "execve");
			CHECK_EQ(sbx_status_to_returncode(st), 127);
		} else {
			CHECK_EQ(rc, 1);
			CHECK_EQ(sbx_status_to_returncode(st), 0);
		}
		close(chan.host);
		close(con.host);
	}
}

static void test_bad_request(void)
{
	char *const argv[] = {"/bin/true", NULL};
	struct sbx_spawn_req req = {argv[0], argv, ENVP, -1, 1, NULL, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
	struct sbx_child c;
	CHECK_EQ(sbx_spawn(&req, &c, &E), -EBADF);
}

static void test_exit_status(void)
{
	char *const argv[] = {"/bin/sh", "-c", "exit 7", NULL};
	struct sbx_child c;
	struct pair chan, con;
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &E), 0);
	CHECK(c.pid > 0);
	CHECK_EQ(c.pidfd >= 0, !sbx_forced_fallbacks.no_pidfd);
	int st;
	reap(&c, &st);
	CHECK(WIFEXITED(st));
	CHECK_EQ(sbx_status_to_returncode(st), 7);
	close(chan.host);
	close(con.host);
}

static void test_fd_layout_and_privs(void)
{
	/* A leaked inheritable fd in the parent must not reach the child. */
	int leak = open("/dev/null", O_RDONLY);
	int leak_hi = fcntl(leak, F_DUPFD, 40);
	/* Dispositions and mask that must not be inherited. */
	struct sigaction ign = {.sa_handler = SIG_IGN}, old_term;
	sigaction(SIGTERM, &ign, &old_term);
	sigset_t usr1, oldmask;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, &oldmask);

	char *const argv[] = {"/bin/sleep", "30", NULL};
	struct sbx_child c;
	struct pair chan, con;
	chan = mkpair();
	con = mkpair();
	ino_t chan_ino = my_ino(chan.child), con_ino = my_ino(con.child);
	struct sbx_spawn_req req = {argv[0], argv, ENVP, chan.child, con.child, NULL, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
	CHECK_EQ(sbx_spawn(&req, &c, &E), 0);
	close(chan.child);
	close(con.child);
	sigaction(SIGTERM, &old_term, NULL);
	sigprocmask(SIG_SETMASK, &oldmask, NULL);
	close(leak);
	close(leak_hi);

	/* The dynamic loader opens (and closes) files at start-up: wait for it to settle. */
	unsigned long long fds = 0;
	for (int i = 0; i < 200; i++) {
		fds = open_fds(c.pid);
		if (fds == 0x1f)
			break;
		sleep_ms(10);
	}
	CHECK_EQ(fds, 0x1f); /* exactly 0, 1, 2, 3, 4 */
	struct stat null_st, st0;
	stat("/dev/null", &null_st);
	char p0[64];
	snprintf(p0, sizeof(p0), "/proc/%d/fd/0", (int)c.pid);
	CHECK_EQ(stat(p0, &st0), 0);
	CHECK(st0.st_rdev == null_st.st_rdev && S_ISCHR(st0.st_mode));
	CHECK(fd_ino(c.pid, 3) == chan_ino);
	CHECK(fd_ino(c.pid, 1) == con_ino);
	CHECK(fd_ino(c.pid, 2) == con_ino);
	CHECK(fd_ino(c.pid, 4) == con_ino);

	char v[128];
	status_field(c.pid, "NoNewPrivs", v, sizeof(v));
	CHECK_STR(v, "1");
	status_field(c.pid, "SigBlk", v, sizeof(v));
	CHECK_STR(v, "0000000000000000");
	/* Nothing ignored: not SIGTERM (ignored above), nor glibc's reserved 32/33, which some
	 * environments (e.g. a CI runner) hand down ignored and glibc's sigaction cannot reset. */
	status_field(c.pid, "SigIgn", v, sizeof(v));
	CHECK_STR(v, "0000000000000000");
	CHECK_EQ(getpgid(c.pid), c.pid); /* its own process group */

	int st;
	CHECK_EQ(sbx_child_wait(&c, 0, &st), 0); /* still running */
	CHECK_EQ(sbx_child_signal(&c, SIGKILL), 0);
	reap(&c, &st);
	CHECK(WIFSIGNALED(st));
	CHECK_EQ(sbx_status_to_returncode(st), -SIGKILL);
	close(chan.host);
	close(con.host);
}

/* The network port's socket lands at fd 7, and only when asked for: with it the child
 * holds 0..4 and 7, nothing at 5 or 6. */
static void test_net_port_fd(void)
{
	char *const argv[] = {"/bin/sleep", "30", NULL};
	struct pair chan = mkpair(), con = mkpair(), net = mkpair();
	ino_t net_ino = my_ino(net.child);
	struct sbx_spawn_req req = {argv[0], argv, ENVP, chan.child, con.child, NULL, 0, -1, 0, -1,
				    1, net.child, 0, -1, -1, 0, {-1, -1, -1, -1}};
	struct sbx_child c;
	CHECK_EQ(sbx_spawn(&req, &c, &E), 0);
	close(chan.child);
	close(con.child);
	close(net.child);
	unsigned long long fds = 0;
	for (int i = 0; i < 200; i++) {
		fds = open_fds(c.pid);
		if (fds == 0x9f)
			break;
		sleep_ms(10);
	}
	CHECK_EQ(fds, 0x9f); /* 0..4 and 7 */
	CHECK(fd_ino(c.pid, SBX_CHILD_NET_FD) == net_ino);
	int st;
	CHECK_EQ(sbx_child_signal(&c, SIGKILL), 0);
	reap(&c, &st);
	close(chan.host);
	close(con.host);
	close(net.host);

	/* with_net and no fd: refused before any fork. */
	req.net_fd = -1;
	CHECK_EQ(sbx_spawn(&req, &c, &E), -EBADF);
}

/* The images at fds 8, 9 and disk i at 10 + i (a jailed QEMU opens them as /proc/self/fd/N),
 * nothing at 7; the disk fds past the last disk stay closed. */
static void test_image_fds(void)
{
	char *const argv[] = {"/bin/sleep", "30", NULL};
	static const unsigned counts[] = {0, 1, SBX_CHILD_DISKS_MAX};
	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		unsigned ndisks = counts[k];
		struct pair chan = mkpair(), con = mkpair();
		int kernel = open("/dev/null", O_RDONLY | O_CLOEXEC);
		int rootfs = open("/dev/zero", O_RDONLY | O_CLOEXEC);
		int disks[SBX_CHILD_DISKS_MAX] = {-1, -1, -1, -1, -1, -1};
		static const char *const sources[] = {"/dev/urandom", "/dev/random", "/dev/full",
						      "/dev/null",    "/etc/passwd", "/etc/group"};
		/* told apart by inode */
		for (unsigned i = 0; i < ndisks; i++)
			disks[i] = open(sources[i], O_RDONLY | O_CLOEXEC);
		ino_t rootfs_ino = my_ino(rootfs);
		struct sbx_spawn_req req = {argv[0], argv, ENVP, chan.child, con.child, NULL, 0, -1,
					    0, -1, 0, -1, 1, kernel, rootfs, ndisks,
					    {disks[0], disks[1], disks[2], disks[3], disks[4], disks[5]}};
		struct sbx_child c;
		CHECK_EQ(sbx_spawn(&req, &c, &E), 0);
		close(chan.child);
		close(con.child);
		unsigned long long want = 0x31f; /* 0..4, 8, 9 */
		for (unsigned i = 0; i < ndisks; i++)
			want |= 1ull << (SBX_CHILD_DISK_FD_BASE + i);
		unsigned long long fds = 0;
		for (int i = 0; i < 200; i++) {
			fds = open_fds(c.pid);
			if (fds == want)
				break;
			sleep_ms(10);
		}
		CHECK_EQ(fds, want);
		CHECK(fd_ino(c.pid, SBX_CHILD_ROOTFS_FD) == rootfs_ino);
		for (unsigned i = 0; i < ndisks; i++) /* in order */
			CHECK(fd_ino(c.pid, SBX_CHILD_DISK_FD_BASE + (int)i) == my_ino(disks[i]));
		int st;
		CHECK_EQ(sbx_child_signal(&c, SIGKILL), 0);
		reap(&c, &st);
		close(chan.host);
		close(con.host);
		close(kernel);
		close(rootfs);
		for (unsigned i = 0; i < ndisks; i++)
			close(disks[i]);
	}
}

/* More disks than fds 10..15 hold, or a disk without an fd: refused before any fork. */
static void test_disk_fds_refused(void)
{
	char *const argv[] = {"/bin/true", NULL};
	struct sbx_spawn_req req = {argv[0], argv, ENVP, 3, 4, NULL, 0, -1, 0, -1, 0, -1, 1, 0, 0,
				    SBX_CHILD_DISKS_MAX + 1, {0, 0, 0, 0, 0, 0}};
	struct sbx_child c;
	struct sbx_err why = {0};
	CHECK_EQ(sbx_spawn(&req, &c, &why), -EINVAL);
	CHECK_STR(why.msg, "at most 6 disks");
	req.ndisks = 2;
	req.disk_fds[1] = -1;
	CHECK_EQ(sbx_spawn(&req, &c, &E), -EBADF);
}

static void test_overlapping_fds(void)
{
	/* Sources sitting on the target numbers, crossed: channel at 4 and console at 3, then
	 * channel at 0 (stdin of this test). */
	for (int round = 0; round < 2; round++) {
		struct pair chan = mkpair(), con = mkpair();
		int saved_stdin = dup(0);
		int chan_at = round == 0 ? 4 : 0, con_at = 3;
		int held3 = fcntl(3, F_GETFD) >= 0 ? dup(3) : -1;
		int held4 = fcntl(4, F_GETFD) >= 0 ? dup(4) : -1;
		dup2(chan.child, chan_at);
		dup2(con.child, con_at);
		close(chan.child);
		close(con.child);
		char *const argv[] = {"/bin/sh", "-c",
				      "grep NoNewPrivs /proc/self/status >&3; echo console >&4", NULL};
		struct sbx_spawn_req req = {argv[0], argv, ENVP, chan_at, con_at, NULL, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
		struct sbx_child c;
		CHECK_EQ(sbx_spawn(&req, &c, &E), 0);
		close(chan_at);
		close(con_at);
		dup2(saved_stdin, 0);
		close(saved_stdin);
		if (held3 >= 0) {
			dup2(held3, 3);
			close(held3);
		}
		if (held4 >= 0) {
			dup2(held4, 4);
			close(held4);
		}
		char buf[256];
		read_all(chan.host, buf, sizeof(buf));
		CHECK_STR(buf, "NoNewPrivs:\t1\n");
		read_all(con.host, buf, sizeof(buf));
		CHECK_STR(buf, "console\n");
		int st;
		reap(&c, &st);
		CHECK_EQ(sbx_status_to_returncode(st), 0);
		close(chan.host);
		close(con.host);
	}
}

static void test_stdio(void)
{
	char *const argv[] = {"/bin/sh", "-c",
			      "echo out; echo err >&2; if read x; then echo notnull; else echo null; fi; "
			      "echo chan >&3",
			      NULL};
	struct sbx_child c;
	struct pair chan, con;
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &E), 0);
	char buf[256];
	read_all(con.host, buf, sizeof(buf));
	CHECK_STR(buf, "out\nerr\nnull\n");
	read_all(chan.host, buf, sizeof(buf));
	CHECK_STR(buf, "chan\n");
	reap(&c, NULL);
	close(chan.host);
	close(con.host);
}

static void test_environment(void)
{
	char *const argv[] = {"/bin/sh", "-c", "env >&3", NULL};
	struct sbx_child c;
	struct pair chan, con;
	setenv("SBX_SECRET_TEST", "leak", 1);
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &E), 0);
	char buf[4096];
	read_all(chan.host, buf, sizeof(buf));
	CHECK(strstr(buf, "PATH=/usr/bin:/bin") != NULL);
	CHECK(strstr(buf, "SBX_SECRET_TEST") == NULL);
	unsetenv("SBX_SECRET_TEST");
	reap(&c, NULL);
	close(chan.host);
	close(con.host);
}

static void test_parent_death_kills_child(void)
{
	/* A middle process spawns `sleep`, reports its pid and exits; as subreaper we inherit the
	 * orphan and must see it die of SIGKILL (PR_SET_PDEATHSIG). */
	CHECK_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
	int p[2];
	CHECK_EQ(pipe(p), 0);
	pid_t middle = fork();
	if (middle == 0) {
		char *const argv[] = {"/bin/sleep", "30", NULL};
		struct pair chan = mkpair(), con = mkpair();
		struct sbx_spawn_req req = {argv[0], argv, ENVP, chan.child, con.child, NULL, 0, -1, 0, -1, 0, -1, 0, -1, -1, 0, {-1, -1, -1, -1}};
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
		pid_t r;
		/* Reparented to us: reap it (blocking, but it should already be dying). */
		alarm(10);
		r = waitpid(grandchild, &st, 0);
		alarm(0);
		CHECK_EQ(r, grandchild);
		CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	}
	prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
}

/* Kernel < 5.3 (no pidfd_open): the child has no pidfd, and signalling and reaping go through
 * its pid (kill, waitpid). */
static void test_without_pidfd_signal_and_reap_by_pid(void)
{
	struct sbx_forced_fallbacks saved = sbx_forced_fallbacks;
	sbx_forced_fallbacks.no_pidfd = 1;
	char *const argv[] = {"/bin/sleep", "30", NULL};
	struct sbx_child c;
	struct pair chan, con;
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &E), 0);
	CHECK_EQ(c.pidfd, -1);
	int st = 0;
	CHECK_EQ(sbx_child_wait(&c, 0, &st), 0); /* still running */
	CHECK_EQ(sbx_child_signal(&c, SIGKILL), 0);
	CHECK_EQ(sbx_child_wait(&c, 1, &st), 1);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	close(chan.host);
	close(con.host);
	sbx_forced_fallbacks = saved;
}

/* Kernel 5.3 (pidfd_open, but waitid(P_PIDFD) is EINVAL): reaped with waitpid, status intact. */
static void test_without_waitid_pidfd_reaps_by_pid(void)
{
	struct sbx_forced_fallbacks saved = sbx_forced_fallbacks;
	sbx_forced_fallbacks.no_waitid_pidfd = 1;
	char *const argv[] = {"/bin/sh", "-c", "exit 7", NULL};
	struct sbx_child c;
	struct pair chan, con;
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &E), 0);
	int st = 0;
	CHECK_EQ(sbx_child_wait(&c, 1, &st), 1);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 7);
	if (c.pidfd >= 0)
		close(c.pidfd);
	close(chan.host);
	close(con.host);
	sbx_forced_fallbacks = saved;
}

/* Kernel < 5.9 (no close_range): the child closes inherited fds one by one; none survives. */
static void test_without_close_range_inherited_fds_are_closed(void)
{
	struct sbx_forced_fallbacks saved = sbx_forced_fallbacks;
	sbx_forced_fallbacks.no_close_range = 1;
	int leak = open("/dev/null", O_RDONLY); /* inheritable, low and high */
	int leak_hi = fcntl(leak, F_DUPFD, 50);
	char *const argv[] = {"/bin/sleep", "30", NULL};
	struct sbx_child c;
	struct pair chan, con;
	CHECK_EQ(spawn_argv(argv, &c, &chan, &con, &E), 0);
	close(leak);
	close(leak_hi);
	unsigned long long fds = 0;
	for (int i = 0; i < 200; i++) {
		fds = open_fds(c.pid);
		if (fds == 0x1f)
			break;
		sleep_ms(10);
	}
	CHECK_EQ(fds, 0x1f); /* exactly 0, 1, 2, 3, 4 */
	sbx_child_signal(&c, SIGKILL);
	reap(&c, NULL);
	close(chan.host);
	close(con.host);
	sbx_forced_fallbacks = saved;
}

int main(void)
{
	const char *name = force_fallbacks_from_env("test_qemu_spawn");
	RUN(test_exec_failure_enoent);
	RUN(test_exec_failure_eacces);
	RUN(test_start_reports_the_exec_through_the_error_pipe);
	RUN(test_bad_request);
	RUN(test_exit_status);
	RUN(test_fd_layout_and_privs);
	RUN(test_net_port_fd);
	RUN(test_image_fds);
	RUN(test_disk_fds_refused);
	RUN(test_overlapping_fds);
	RUN(test_stdio);
	RUN(test_environment);
	RUN(test_parent_death_kills_child);
	RUN(test_without_pidfd_signal_and_reap_by_pid);
	RUN(test_without_waitid_pidfd_reaps_by_pid);
	RUN(test_without_close_range_inherited_fds_are_closed);
	TEST_MAIN_END(name);
}
