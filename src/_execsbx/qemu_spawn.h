/* clone+exec of a child (QEMU) with a fixed fd layout:
 *     0  /dev/null
 *     1  console socket        2  console socket
 *     3  channel socket        4  console socket
 *     5  QMP socket (only when requested)
 *     6  guest RAM file (only when requested)
 *     7  network port socket (only when the VM has the network port)
 *     8  kernel, 9 root image, 10..15 the other disks, in the config's order (only when the
 *        host opened the images: a jailed QEMU opens them as /proc/self/fd/N, with no path
 *        into the caller's directories)
 * and nothing else open, a default signal mask and dispositions, its own process group,
 * no_new_privs, and SIGKILL when the parent thread dies.
 *
 * Everything the child needs is prepared before the clone; between clone() and execve() the child
 * makes only async-signal-safe calls, so spawning from a multi-threaded process is safe. */
#ifndef SBX_SPAWN_H
#define SBX_SPAWN_H

#include <sys/types.h>

#include "sbx_err.h"

struct sbx_jail;

#define SBX_CHILD_CHANNEL_FD 3
#define SBX_CHILD_CONSOLE_FD 4
#define SBX_CHILD_QMP_FD 5
#define SBX_CHILD_MEM_FD 6
/* How QEMU opens it: a magic link to the host's open file, so it works inside the jail's
 * read-only mount tree and QEMU gets that one file, not a writable directory. */
#define SBX_CHILD_MEM_FD_PATH "/proc/self/fd/6"
/* The host end of the network port (net_protocol.h), a chardev like the agent channel. */
#define SBX_CHILD_NET_FD 7
/* The images, opened by the host (read-only, but for a writable disk): an unprivileged QEMU could
 * not reach them by path (a root caller's cache is 0700), and its root holds no such path
 * anyway. Disk i (qemu_argv.h's disks[i]) is at SBX_CHILD_DISK_FD_BASE + i. */
#define SBX_CHILD_KERNEL_FD 8
#define SBX_CHILD_ROOTFS_FD 9
#define SBX_CHILD_DISK_FD_BASE 10
/* Six: the microvm machine (acpi=off) has eight virtio-mmio transports, and the root disk and
 * the virtio-serial bus take two (a work disk, a package layer or template and three volumes). */
#define SBX_CHILD_DISKS_MAX 6
#define SBX_CHILD_KERNEL_FD_PATH "/proc/self/fd/8"
#define SBX_CHILD_ROOTFS_FD_PATH "/proc/self/fd/9"
#define SBX_CHILD_FIRST_CLOSED_FD (SBX_CHILD_DISK_FD_BASE + SBX_CHILD_DISKS_MAX)

struct sbx_spawn_req {
	const char *path;   /* execve path: no PATH search */
	char *const *argv;  /* NULL-terminated */
	char *const *envp;  /* NULL-terminated */
	int channel_fd;     /* becomes fd 3 in the child; any fd number, need not be inheritable */
	int console_fd;     /* becomes fds 1, 2 and 4 */
	struct sbx_jail *jail; /* NULL: no jail (jail.h); else prepared, and its status may change
				* (a layer the kernel refuses at clone/placement time) */
	int with_qmp;       /* 0 (a zero-initialised request): no QMP socket, fd 5 stays closed */
	int qmp_fd;         /* with_qmp: becomes fd 5 */
	int with_mem;       /* 0: no guest RAM file, fd 6 stays closed */
	int mem_fd;         /* with_mem: the guest RAM's backing file, becomes fd 6 */
	int with_net;       /* 0: no network port socket, fd 7 stays closed */
	int net_fd;         /* with_net: becomes fd 7 */
	int with_images;    /* 0: fds 8-15 stay closed */
	int kernel_fd;      /* with_images: becomes fd 8 */
	int rootfs_fd;      /* with_images: becomes fd 9 */
	unsigned ndisks;    /* with_images: disk_fds[i] becomes fd 10 + i; the rest of 10-15 stay
			     * closed. At most SBX_CHILD_DISKS_MAX (-EINVAL) */
	int disk_fds[SBX_CHILD_DISKS_MAX];
};

struct sbx_child {
	pid_t pid;
	int pidfd; /* -1 if the kernel has no pidfd_open (< 5.3) */
};

/* A started child: the parent's ends of its error pipe and go pipe. */
struct sbx_spawn_pending {
	int err_fd; /* O_NONBLOCK; readable once the child exec'd (EOF) or failed (a report) */
	int go_fd;  /* held until the exec: its hang-up tells a child that the parent died */
	struct sbx_jail *jail; /* the request's: told of a layer the child went without */
};

/* Start the child: 0 with *out filled (the caller owns pid and pidfd, and must reap) and *pending
 * open; -errno (no child left, err names the step) otherwise. The calling thread (only it) waits
 * while the child takes its jail steps, until its exec or exit (qemu_spawn.c: spawn_clone); the
 * outcome is then ready on pending->err_fd: wait for it to be readable (e.g. on an event loop) and
 * call sbx_spawn_finish. */
int sbx_spawn_start(const struct sbx_spawn_req *req, struct sbx_child *out,
		    struct sbx_spawn_pending *pending, struct sbx_err *err);
/* How the start ended: 1 once the child has exec'd, 0 while it has not (blocking=0 only),
 * -errno with err naming the failed step (e.g. "execve") when it failed before exec; it then
 * exits by itself, and the caller still reaps it. Closes *pending unless it returns 0. */
int sbx_spawn_finish(struct sbx_spawn_pending *p, int blocking, struct sbx_err *err);
void sbx_spawn_pending_close(struct sbx_spawn_pending *p);

/* Start the child and wait until it has exec'd. On success returns 0 and fills *out (the caller
 * owns pid and pidfd and must reap). On failure returns -errno, the child (if any) is already
 * killed and reaped, and err names the failing call, e.g. "execve", "clone", "dup2". */
int sbx_spawn(const struct sbx_spawn_req *req, struct sbx_child *out, struct sbx_err *err);

/* pidfd_open(2) through syscall(2); -errno on failure. */
int sbx_pidfd_open(pid_t pid);
/* Send sig via the pidfd when there is one (no pid-reuse race), else kill(2). */
int sbx_child_signal(const struct sbx_child *c, int sig);
/* Wait for the child to exit. blocking=0: WNOHANG. Returns 1 and sets *status (a waitpid-style
 * status word) once reaped, 0 if still running (non-blocking only), -errno on error. EINTR is
 * retried. Uses waitid(P_PIDFD) when there is a pidfd, falling back to waitpid. */
int sbx_child_wait(const struct sbx_child *c, int blocking, int *status);
/* Decode a waitpid status like subprocess.Popen.returncode: exit code, or -signal. */
int sbx_status_to_returncode(int status);

#ifdef SBX_TESTING
/* Test-only (tests/c builds with -DSBX_TESTING; the extension has no such symbol): make this
 * process behave as on a kernel without the feature, so that the paths kept for old kernels run
 * on this one. Set before spawning; the child reads its copy. */
struct sbx_forced_fallbacks {
	int no_pidfd;          /* pidfd_open fails with ENOSYS (< 5.3): kill(2), waitpid(2) */
	int no_waitid_pidfd;   /* waitid(P_PIDFD) fails with EINVAL (< 5.4): waitpid(2) */
	int no_close_range;    /* close_range fails with ENOSYS (< 5.9): the close loop */
	int refuse_namespaces; /* clone(CLONE_NEW*) fails with EPERM: a plain clone, layer off */
};
extern struct sbx_forced_fallbacks sbx_forced_fallbacks;
#endif

#endif /* SBX_SPAWN_H */
