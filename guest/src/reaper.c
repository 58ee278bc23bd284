/* Child reaping: see reaper.h. As PID 1 the agent inherits every orphan of the guest, and a zombie
 * it forgets holds a pid forever; so every wake-up reaps until waitpid() has nothing left. */
#include "reaper.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"

int sbx_reaper_init(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGIO);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

void sbx_reaper_handle(int sfd, sbx_exit_fn fn, void *ctx, bool *sigio)
{
	struct signalfd_siginfo si[16];
	ssize_t n;
	while ((n = read(sfd, si, sizeof(si))) > 0) {
		for (size_t i = 0; i < (size_t)n / sizeof(si[0]); i++)
			if (si[i].ssi_signo == SIGIO)
				*sigio = true;
	}
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid > 0) {
			fn(ctx, pid, status);
			continue;
		}
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0 && errno != ECHILD)
			sbx_log("waitpid: %s", strerror(errno));
		break;
	}
}
