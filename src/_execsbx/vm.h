/* One QEMU process and the host ends of its two sockets, without Python: started from a ready
 * argv (qemu_argv.h), polled, killed and closed. The Python type in vm_type.c wraps this. */
#ifndef SBX_VM_H
#define SBX_VM_H

#include <stddef.h>
#include <sys/types.h>

#include "channel.h"
#include "spawn.h"

struct sbx_vm {
	struct sbx_child child; /* pid/pidfd: -1 once closed */
	int console_fd;         /* host end of the console socket, O_NONBLOCK; -1 once closed */
	int reaped;             /* wait_status is valid */
	int wait_status;        /* waitpid-style status word */
	int closed;
	struct sbx_channel ch;  /* host end of the agent channel */
	struct sbx_jail *jail;  /* heap, owned; NULL when spawned without a jail. Kept after close
				 * for its status and the cgroup's usage figures. */
};

/* What sbx_vm_begin_close leaves to release outside of any lock: a SIGKILLed child to reap and
 * fds to close. */
struct sbx_vm_remains {
	struct sbx_child child;
	int reaped;
	int fds[2];
	struct sbx_jail *jail; /* finished (usage read, cgroup removed) after the reap */
};

/* Put vm in the closed state without resources (so that destroy paths are always safe). */
void sbx_vm_init(struct sbx_vm *vm);
/* Create both socketpairs and spawn argv[0] with the fd layout of spawn.h. On failure returns
 * -errno with *where naming the failing call, and vm is still in the closed state. Blocks until
 * the child has exec'd (typically a few ms). */
int sbx_vm_spawn(struct sbx_vm *vm, char *const *argv, const char **where);
/* The same inside the host jail (jail.h) configured by cfg. Layers the host cannot provide are
 * off with a reason in vm->jail->status. */
struct sbx_jail_config;
int sbx_vm_spawn_jailed(struct sbx_vm *vm, char *const *argv, const struct sbx_jail_config *cfg,
			const char **where);
/* SIGKILL the child unless it is already reaped. Idempotent. 0 or -errno. */
int sbx_vm_kill(struct sbx_vm *vm);
/* Non-blocking: 1 and *returncode (subprocess style: exit code or -signal) once exited, else 0;
 * -errno on error. After a successful close this keeps returning the final status. */
int sbx_vm_poll_exit(struct sbx_vm *vm, int *returncode);
/* Non-blocking read from the console socket into buf, up to n bytes (several reads if they
 * come). Returns the count (0 for nothing now or EOF) or -errno. */
ssize_t sbx_vm_read_console(struct sbx_vm *vm, void *buf, size_t n);

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
