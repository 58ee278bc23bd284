/* For any socket file a VM ever needs (none today: the agent channel and the console are
 * socketpairs handed to QEMU as fds, which no other process can connect to): a private directory
 * per VM and a check of who connected.
 *
 * The directory is 0700, owned by the caller, created fresh under a parent that must already
 * exist; sbx_sockdir_remove deletes it and what is in it (one level: sockets only). */
#ifndef SBX_SOCKDIR_H
#define SBX_SOCKDIR_H

#include <limits.h>
#include <sys/types.h>

struct sbx_sockdir {
	char path[PATH_MAX]; /* "" when none */
};

/* mkdtemp(parent/sbx-vm-XXXXXX) with mode 0700. 0 or -errno. */
int sbx_sockdir_create(struct sbx_sockdir *d, const char *parent);
/* Unlink every entry, then rmdir. Idempotent. */
void sbx_sockdir_remove(struct sbx_sockdir *d);
/* SO_PEERCRED of a connected unix socket: 0 if the peer runs as expect_uid (and, if expect_pid is
 * > 0, is that process), -EPERM if not, -errno if the credentials cannot be read. */
int sbx_peer_check(int fd, uid_t expect_uid, pid_t expect_pid);

#endif /* SBX_SOCKDIR_H */
