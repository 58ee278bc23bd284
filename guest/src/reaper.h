/* Child reaping through a signalfd: SIGCHLD (and SIGIO, the channel's "host opened" hint) are
 * blocked and read from an fd in the event loop instead of interrupting it. */
#ifndef SBX_REAPER_H
#define SBX_REAPER_H

#include <stdbool.h>
#include <sys/types.h>

typedef void (*sbx_exit_fn)(void *ctx, pid_t pid, int status);

/* Block the signals and return a non-blocking signalfd for them (or a negative errno). Must run
 * before the first fork, so that no SIGCHLD is lost. */
int sbx_reaper_init(void);
/* Drain the signalfd, then reap every exited child, main or orphan: signals coalesce, so one
 * SIGCHLD can stand for many children. *sigio is set when SIGIO was among the signals. */
void sbx_reaper_handle(int sfd, sbx_exit_fn fn, void *ctx, bool *sigio);

#endif /* SBX_REAPER_H */
