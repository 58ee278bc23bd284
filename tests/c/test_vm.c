/* Tests of the QEMU lifecycle layer (vm.c) with /bin/sh standing in for QEMU: it writes frames
 * to fd 3 with printf, as the guest agent would through virtio-serial. */
#define _GNU_SOURCE 1
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <sys/stat.h>

#include "forced_fallbacks.h"
#include "jail.h"
#include "test.h"

/* Where a test does not look at the explanation of an error. */
static struct sbx_err E;
#include "vm.h"

static struct sbx_vm VM;

/* Start VM and wait for the exec (as Vm() and its wait_spawn() do); on failure VM is left closed
 * with nothing behind. opts NULL: a plain VM. */
static int spawn(char *const *argv, const struct sbx_vm_start_opts *opts, struct sbx_err *err)
{
	static const struct sbx_vm_start_opts plain = {0};
	int rc = sbx_vm_start(&VM, argv, opts ? opts : &plain, err);
	if (rc < 0)
		return rc;
	rc = sbx_vm_start_check(&VM, 1, err);
	if (rc == 1)
		return 0;
	sbx_vm_destroy(&VM);
	sbx_vm_init(&VM);
	return rc;
}

/* READY(id 0, version 1, "test") and STDOUT(id 5, "hi") as octal printf escapes. */
#define READY_FRAME "\\014\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000\\000" \
		    "\\001\\000\\000\\000\\004\\000\\000\\000test"
#define STDOUT_FRAME "\\002\\000\\000\\000\\002\\000\\000\\000\\005\\000\\000\\000hi"

/* Collect events for up to timeout_ms until one of kind `want` (or eof if want == 0). */
static int wait_event(int want, int timeout_ms, struct sbx_event *out)
{
	for (int waited = 0; waited <= timeout_ms; waited += 10) {
		struct sbx_event ev;
		int rc;
		for (;;) {
			while ((rc = sbx_channel_next_event(&VM.ch, &ev)) == 1)
				if ((int)ev.kind == want) {
					if (out)
						*out = ev;
					return 1;
				}
			if (rc < 0)
				return rc;
			if (VM.ch.eof)
				return want == 0 ? 1 : -EPIPE;
			ssize_t n = sbx_channel_read(&VM.ch, 1 << 20, &E);
			if (n < 0)
				return (int)n;
			if (n == 0 && !VM.ch.eof)
				break;
		}
		struct pollfd p = {VM.ch.fd, POLLIN, 0};
		poll(&p, 1, 10);
	}
	return 0;
}

static int wait_exit(int timeout_ms, int *code)
{
	for (int waited = 0; waited <= timeout_ms; waited += 5) {
		int rc = sbx_vm_poll_exit(&VM, code, &E);
		if (rc != 0)
			return rc;
		usleep(5000);
	}
	return 0;
}

static void test_lifecycle_kill(void)
{
	char *const argv[] = {"/bin/sh", "-c",
			      "printf '" READY_FRAME "' >&3; echo hello-console; exec sleep 30", NULL};
	sbx_vm_init(&VM);
	CHECK_EQ(VM.closed, 1);
	struct sbx_err where = {0};
	CHECK_EQ(spawn(argv, NULL, &where), 0);
	CHECK_EQ(VM.closed, 0);
	CHECK(VM.child.pid > 0 && VM.console_fd >= 0 && VM.ch.fd >= 0);
	CHECK_EQ(VM.child.pidfd >= 0, !sbx_forced_fallbacks.no_pidfd);
	struct sbx_event ev;
	CHECK_EQ(wait_event(SBX_EV_READY, 5000, &ev), 1);
	CHECK_EQ(ev.protocol_version, 1);
	CHECK(ev.len == 4 && memcmp(ev.data, "test", 4) == 0);

	char buf[256];
	ssize_t n = 0;
	for (int i = 0; i < 500 && n == 0; i++) {
		n = sbx_vm_read_console(&VM, buf, sizeof(buf) - 1, &E);
		if (n == 0)
			usleep(2000);
	}
	CHECK_EQ(n, 14);
	buf[n > 0 ? n : 0] = 0;
	CHECK_STR(buf, "hello-console\n");
	CHECK_EQ(sbx_vm_read_console(&VM, buf, sizeof(buf), &E), 0); /* nothing more: no blocking */

	CHECK_EQ(sbx_channel_queue_ping(&VM.ch, 1, &E), 0);
	CHECK_EQ(sbx_channel_pending(&VM.ch), 0);
	int code = 12345;
	CHECK_EQ(sbx_vm_poll_exit(&VM, &code, &E), 0);
	CHECK_EQ(sbx_vm_kill(&VM, &E), 0);
	CHECK_EQ(wait_exit(5000, &code), 1);
	CHECK_EQ(code, -SIGKILL);
	CHECK_EQ(sbx_vm_kill(&VM, &E), 0); /* reaped: no-op */
	sbx_vm_close(&VM);
	CHECK_EQ(VM.closed, 1);
	CHECK(VM.child.pid == -1 && VM.child.pidfd == -1 && VM.console_fd == -1 && VM.ch.fd == -1);
	sbx_vm_close(&VM); /* idempotent */
	code = 0;
	CHECK_EQ(sbx_vm_poll_exit(&VM, &code, &E), 1);
	CHECK_EQ(code, -SIGKILL);
}

static void test_exit_and_eof(void)
{
	char *const argv[] = {"/bin/sh", "-c", "printf '" STDOUT_FRAME "' >&3; exit 3", NULL};
	sbx_vm_init(&VM);
	CHECK_EQ(spawn(argv, NULL, &E), 0);
	struct sbx_event ev;
	CHECK_EQ(wait_event(SBX_EV_STDOUT, 5000, &ev), 1);
	CHECK_EQ(ev.id, 5);
	CHECK(ev.len == 2 && memcmp(ev.data, "hi", 2) == 0);
	CHECK_EQ(wait_event(0, 5000, NULL), 1);
	CHECK_EQ(VM.ch.eof, 1);
	int code;
	CHECK_EQ(wait_exit(5000, &code), 1);
	CHECK_EQ(code, 3);
	/* Writing to a dead peer: an error, not SIGPIPE. */
	CHECK_EQ(sbx_channel_queue_ping(&VM.ch, 2, &E), -EPIPE);
	sbx_vm_close(&VM);
	CHECK_EQ(sbx_vm_poll_exit(&VM, &code, &E), 1);
	CHECK_EQ(code, 3);
}

static void test_close_running(void)
{
	/* close() on a live child: SIGKILL + blocking reap, no zombie left. */
	char *const argv[] = {"/bin/sleep", "30", NULL};
	sbx_vm_init(&VM);
	CHECK_EQ(spawn(argv, NULL, &E), 0);
	pid_t pid = VM.child.pid;
	sbx_vm_close(&VM);
	CHECK_EQ(kill(pid, 0), -1);
	CHECK_EQ(errno, ESRCH);
	int code;
	CHECK_EQ(sbx_vm_poll_exit(&VM, &code, &E), 1);
	CHECK_EQ(code, -SIGKILL);
}

static void test_spawn_failure_leaves_closed(void)
{
	char *const argv[] = {"/nonexistent/qemu", NULL};
	sbx_vm_init(&VM);
	struct sbx_err where = {0};
	CHECK_EQ(spawn(argv, NULL, &where), -ENOENT);
	CHECK_STR(where.msg, "execve");
	CHECK_EQ(VM.closed, 1);
	CHECK(VM.child.pid == -1 && VM.console_fd == -1 && VM.ch.fd == -1);
	sbx_vm_close(&VM);
	int code;
	CHECK_EQ(sbx_vm_poll_exit(&VM, &code, &E), 0);
}

static void test_qmp_socket(void)
{
	/* The child finds the QMP socket at fd 5: it echoes one line back on it. Without QMP,
	 * fd 5 is closed in the child. */
	char *const argv[] = {"/bin/sh", "-c", "read line <&5; echo \"got $line\" >&5; exec sleep 30",
			      NULL};
	sbx_vm_init(&VM);
	CHECK_EQ(VM.qmp_fd, -1);
	struct sbx_vm_start_opts qmp = {.with_qmp = 1};
	CHECK_EQ(spawn(argv, &qmp, &E), 0);
	CHECK(VM.qmp_fd >= 0);
	CHECK_EQ(write(VM.qmp_fd, "hello\n", 6), 6);
	char buf[64] = {0};
	ssize_t n = 0;
	for (int i = 0; i < 1000 && n <= 0; i++) {
		n = read(VM.qmp_fd, buf, sizeof(buf) - 1);
		if (n < 0 && errno == EAGAIN) /* O_NONBLOCK on the host end */
			usleep(2000);
	}
	CHECK_EQ(n, 10);
	CHECK_STR(buf, "got hello\n");
	sbx_vm_close(&VM);
	CHECK_EQ(VM.qmp_fd, -1);

	char *const argv2[] = {"/bin/sh", "-c", "if [ -e /proc/self/fd/5 ]; then exit 1; else exit 0; fi", NULL};
	sbx_vm_init(&VM);
	CHECK_EQ(spawn(argv2, NULL, &E), 0);
	CHECK_EQ(VM.qmp_fd, -1);
	int code;
	CHECK_EQ(wait_exit(5000, &code), 1);
	CHECK_EQ(code, 0);
	sbx_vm_close(&VM);
}

static void test_options_place_their_fds(void)
{
	/* with_net: the port's socket at fd 7, the host's end in VM.net_fd (the child answers a line
	 * on it); with_mem: a copy of the caller's fd at 6 (the child reads the file through it). */
	char path[] = "/tmp/sbx-test-vm-XXXXXX";
	int mem = mkstemp(path);
	CHECK(mem >= 0);
	unlink(path);
	CHECK_EQ(write(mem, "ram", 3), 3);
	char *const argv[] = {"/bin/sh", "-c",
			      "read line <&7; echo \"got $line $(cat /proc/self/fd/6)\" >&7; "
			      "exec sleep 30",
			      NULL};
	struct sbx_vm_start_opts opts = {.with_mem = 1, .mem_fd = mem, .with_net = 1};
	sbx_vm_init(&VM);
	CHECK_EQ(VM.net_fd, -1);
	CHECK_EQ(spawn(argv, &opts, &E), 0);
	CHECK(VM.net_fd >= 0 && VM.qmp_fd == -1);
	CHECK_EQ(write(VM.net_fd, "hello\n", 6), 6);
	char buf[64] = {0};
	ssize_t n = 0;
	for (int i = 0; i < 1000 && n <= 0; i++) {
		n = read(VM.net_fd, buf, sizeof(buf) - 1);
		if (n < 0 && errno == EAGAIN) /* O_NONBLOCK on the host end */
			usleep(2000);
	}
	CHECK_STR(buf, "got hello ram\n");
	sbx_vm_close(&VM);
	CHECK_EQ(VM.net_fd, -1);
	close(mem); /* the caller's: the VM had a copy */
}

/* A writable disk under the jail: the host opens it for writing and hands it to QEMU's uid (which
 * reopens /proc/self/fd/N, a check of the file's mode), and RLIMIT_FSIZE becomes its size: the
 * child writes inside it but cannot grow it. The read-only disk beside it stays closed to
 * writing for that uid. */
static void test_writable_disk_under_the_jail(void)
{
	if (geteuid() != 0)
		SKIP("needs root (QEMU's uid of its own)");
	char ro_path[] = "/tmp/sbx-test-disk-ro-XXXXXX", rw_path[] = "/tmp/sbx-test-disk-rw-XXXXXX";
	int ro = mkstemp(ro_path), rw = mkstemp(rw_path);
	CHECK(ro >= 0 && rw >= 0);
	CHECK_EQ(fchmod(ro, 0644), 0); /* as the package cache's images are */
	CHECK_EQ(ftruncate(rw, 4096), 0);
	const struct sbx_vm_disk disks[] = {{ro_path, "layer", 0, 0, 0, 0}, {rw_path, "output", 1, 0, 0, 0}};
	struct sbx_jail_config jail = {.enabled = 1, .uid = 65534, .gid = 65534,
				       .seccomp = SBX_SECCOMP_DENY_LIST};
	char *const argv[] = {
		"/bin/sh", "-c",
		"printf written 1<>/proc/self/fd/11 && echo rw-ok;"
		"(printf x 1<>/proc/self/fd/10) 2>/dev/null || echo ro-refused;"
		"dd if=/dev/zero of=/proc/self/fd/11 bs=1 seek=4096 count=1 conv=notrunc "
		"2>/dev/null || echo growth-refused;"
		"ulimit -f",
		NULL};
	struct sbx_vm_start_opts opts = {.jail = &jail, .kernel = "/dev/null", .rootfs = "/dev/null",
					 .disks = disks, .ndisks = 2};
	sbx_vm_init(&VM);
	CHECK_EQ(spawn(argv, &opts, &E), 0);
	int code;
	CHECK_EQ(wait_exit(5000, &code), 1);
	CHECK_EQ(code, 0);
	char out[256] = {0};
	CHECK(sbx_vm_read_console(&VM, out, sizeof(out) - 1, &E) > 0);
	CHECK_STR(out, "rw-ok\nro-refused\ngrowth-refused\n8\n"); /* 4096 bytes in 512-byte blocks */
	sbx_vm_close(&VM);
	char head[8] = {0};
	struct stat st;
	CHECK_EQ(pread(rw, head, 7, 0), 7);
	CHECK_STR(head, "written");
	CHECK(fstat(rw, &st) == 0 && st.st_size == 4096 && st.st_uid == 65534);
	CHECK(fstat(ro, &st) == 0 && st.st_uid == 0);
	close(ro);
	close(rw);
	unlink(ro_path);
	unlink(rw_path);
}

int main(void)
{
	const char *name = force_fallbacks_from_env("test_vm");
	RUN(test_lifecycle_kill);
	RUN(test_exit_and_eof);
	RUN(test_close_running);
	RUN(test_spawn_failure_leaves_closed);
	RUN(test_qmp_socket);
	RUN(test_options_place_their_fds);
	RUN(test_writable_disk_under_the_jail);
	TEST_MAIN_END(name);
}
