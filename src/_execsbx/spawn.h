/* fork+exec of a child (QEMU) with a fixed fd layout:
 *     0  /dev/null
 *     1  console socket        2  console socket
 *     3  channel socket        4  console socket
 * and nothing else open, a default signal mask and dispositions, its own process group,
 * no_new_privs, and SIGKILL when the parent thread dies.
 *
 * Everything the child needs is prepared before fork(); between fork() and execve() the child
 * makes only async-signal-safe calls, so spawning from a multi-threaded process is safe. */
#ifndef SBX_SPAWN_H
#define SBX_SPAWN_H

#include <sys/types.h>

struct sbx_jail;

#define SBX_CHILD_CHANNEL_FD 3
#define SBX_CHILD_CONSOLE_FD 4
#define SBX_CHILD_FIRST_CLOSED_FD 5

struct sbx_spawn_req {
	const char *path;   /* execve path: no PATH search */
	char *const *argv;  /* NULL-terminated */
	char *const *envp;  /* NULL-terminated */
	int channel_fd;     /* becomes fd 3 in the child; any fd number, need not be inheritable */
	int console_fd;     /* becomes fds 1, 2 and 4 */
	struct sbx_jail *jail; /* NULL: no jail (jail.h); else prepared, and its status may change
				* (a layer the kernel refuses at clone/placement time) */
};

struct sbx_child {
	pid_t pid;
	int pidfd; /* -1 if the kernel has no pidfd_open (< 5.3) */
};

/* Start the child and wait until it has exec'd. On success returns 0 and fills *out (the caller
 * owns pid and pidfd and must reap). On failure returns -errno, the child (if any) is already
 * killed and reaped, and *where names the failing call, e.g. "execve", "fork", "dup2". */
int sbx_spawn(const struct sbx_spawn_req *req, struct sbx_child *out, const char **where);

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

#endif /* SBX_SPAWN_H */
