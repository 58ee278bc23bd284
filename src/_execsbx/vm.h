/* One QEMU process and the host ends of its two sockets, without Python: started from a ready
 * argv (qemu_argv.h), polled, killed and closed. The Python type in py_vm.c wraps this. */
#ifndef SBX_VM_H
#define SBX_VM_H

#include <stddef.h>
#include <sys/types.h>

#include "agent_channel.h"
#include "qemu_argv.h"
#include "qemu_spawn.h"

struct sbx_vm {
	struct sbx_child child; /* pid/pidfd: -1 once closed */
	int console_fd;         /* host end of the console socket, O_NONBLOCK; -1 once closed */
	int qmp_fd;             /* host end of the QMP socket, O_NONBLOCK; -1 if none or closed */
	int net_fd;             /* host end of the network port, O_NONBLOCK; -1 if none or closed */
	int reaped;             /* wait_status is valid */
	int wait_status;        /* waitpid-style status word */
	int closed;
	struct sbx_channel ch;  /* host end of the agent channel */
	struct sbx_jail *jail;  /* heap, owned; NULL when spawned without a jail. Kept after close
				 * for its status and the cgroup's usage figures. */
	struct sbx_spawn_pending spawn; /* open while QEMU has not exec'd yet (sbx_vm_start) */
	int spawn_rc;           /* sbx_vm_start_check's answer once known: 1, or -errno */
	struct sbx_err spawn_err; /* why, when spawn_rc < 0 */
};

/* What sbx_vm_begin_close leaves to release outside of any lock: a SIGKILLed child to reap and
 * fds to close. */
struct sbx_vm_remains {
	struct sbx_child child;
	int reaped;
	int fds[6];            /* channel, console, QMP, spawn's two pipes, net port (-1 when
				* absent) */
	struct sbx_jail *jail; /* finished (usage read, cgroup removed) after the reap */
};

/* Put vm in the closed state without resources (so that destroy paths are always safe). */
void sbx_vm_init(struct sbx_vm *vm);
/* What a VM is started with besides its argv; all zero: a plain VM (channel and console only),
 * no jail. Each option must match the argv (qemu_argv.h's config), which names the fds. */
struct sbx_jail_config;
struct sbx_vm_start_opts {
	const struct sbx_jail_config *jail; /* the host jail (jail.h); NULL: none */
	int with_qmp; /* a third socketpair, QEMU's end at fd 5 (cfg.qmp), the host's in vm->qmp_fd */
	int with_mem; /* mem_fd copied to fd 6, the guest RAM's backing file (cfg.mem_fd) */
	int mem_fd;   /* with with_mem: the caller's fd, which it keeps */
	int with_net; /* the network port's socketpair, QEMU's end at fd 7 (cfg.net_port), the
		       * host's in vm->net_fd */
	/* The images opened here and passed at fds 8, 9 and 10.. (cfg.images_by_fd); NULL kernel:
	 * QEMU opens them by path. The disks are cfg.disks: read-only, but a writable one is opened
	 * for writing and, under a jail with a uid of its own, handed to that uid (fchown: QEMU
	 * reopens /proc/self/fd/N, which checks the file's mode), and the jail's RLIMIT_FSIZE
	 * becomes the largest writable disk's size (writes inside it, no file grown past it). */
	const char *kernel;
	const char *rootfs;
	const struct sbx_vm_disk *disks;
	unsigned ndisks;
};

/* Create the socketpairs and start argv[0] (qemu_spawn.h: sbx_spawn_start) with the fd layout of
 * qemu_spawn.h, returning once the child has exec'd or failed: an event loop waits for sbx_vm_spawn_fd() to be
 * readable and then asks sbx_vm_start_check. opts is never NULL. On failure returns -errno with
 * err filled (a failed call names its step), and vm is still in the closed state. */
int sbx_vm_start(struct sbx_vm *vm, char *const *argv, const struct sbx_vm_start_opts *opts,
		 struct sbx_err *err);
/* The fd that becomes readable once the started child has exec'd or failed; -1 once that is
 * known (or without a start in progress). */
int sbx_vm_spawn_fd(const struct sbx_vm *vm);
/* 1 once QEMU has exec'd; 0 while not yet (blocking=0); -errno with err (e.g. the step "execve") if it
 * failed before exec (the child exits; close the vm to reap it). The answer is kept: later calls
 * return it again. */
int sbx_vm_start_check(struct sbx_vm *vm, int blocking, struct sbx_err *err);
/* SIGKILL the child unless it is already reaped. Idempotent. 0 or -errno. */
int sbx_vm_kill(struct sbx_vm *vm, struct sbx_err *err);
/* Non-blocking: 1 and *returncode (subprocess style: exit code or -signal) once exited, else 0;
 * -errno on error. After a successful close this keeps returning the final status. */
int sbx_vm_poll_exit(struct sbx_vm *vm, int *returncode, struct sbx_err *err);
/* Non-blocking read from the console socket into buf, up to n bytes (several reads if they
 * come). Returns the count (0 for nothing now or EOF) or -errno. */
ssize_t sbx_vm_read_console(struct sbx_vm *vm, void *buf, size_t n, struct sbx_err *err);

/* Closing in two halves, so that a caller holding a lock (the GIL) can drop it for the blocking
 * part: begin (non-blocking) kills the child, moves every fd into *r and marks vm closed (every
 * fd field -1); finish reaps (blocking, the child was SIGKILLed) and closes the fds, returning
 * the wait status (or -1 if there was nothing to reap). Then sbx_vm_set_final_status. */
void sbx_vm_begin_close(struct sbx_vm *vm, struct sbx_vm_remains *r);
int sbx_vm_finish_close(struct sbx_vm_remains *r);
void sbx_vm_set_final_status(struct sbx_vm *vm, int status);
/* Hand the (finished) jail back to vm after finish_close, for its status and usage. */
void sbx_vm_keep_jail(struct sbx_vm *vm, struct sbx_vm_remains *r);
/* Free everything, including the jail. Call once, after close. */
void sbx_vm_destroy(struct sbx_vm *vm);
/* All three in one. Idempotent. */
void sbx_vm_close(struct sbx_vm *vm);

#endif /* SBX_VM_H */
