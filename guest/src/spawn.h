/* Starting user code: the child side of fork() (session, signals, fds, limits, credentials) and
 * the environment it gets. */
#ifndef SBX_SPAWN_H
#define SBX_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "agent.h"
#include "agent_request_guest.h"

struct sbx_spawn {
	const char *interpreter; /* absolute path, e.g. /usr/bin/python3 */
	const char *opt;         /* when set: argv[1] and argv[2] (opt_value), before the rest */
	const char *opt_value;
	const char *script;      /* the code file, passed as the only argument */
	const char *inline_flag; /* when set, argv is {interpreter, inline_flag, inline_code, script} */
	const char *inline_code;
	const char *root;        /* when set: chroot() here before the uid switch (template.h) */
	const char *home;        /* working directory (inside root) */
	const char *home_fallback; /* when set: the working directory if home cannot be entered */
	char *const *envp;
	bool drop_privileges; /* become SBX_USER_UID/GID (only when the agent is root in the VM) */
	bool limit_nproc;     /* RLIMIT_NPROC counts all of the uid's processes: VM only */
	int stdout_fd;        /* write ends of the output pipes */
	int stderr_fd;
	bool with_control;    /* a REPL driver: control_in_fd becomes fd 3, control_out_fd fd 4 */
	int control_in_fd;    /* read end: requests from the agent */
	int control_out_fd;   /* write end: completions to the agent */
	bool with_go;         /* a pre-started interpreter: go_fd becomes fd 3 (see runner.h) */
	int go_fd;            /* socket: "r" to the agent when ready, "1" from it when the code is in place */
	/* A background process (procs.h): argv instead of the interpreter fields, argv[0] looked
	 * up in the PATH of envp when it has no '/'; home is its working directory. */
	char *const *argv;
	bool with_stdin;      /* stdin_fd becomes stdin instead of /dev/null */
	int stdin_fd;
	bool ctty;            /* stdin is a terminal's slave: make it the controlling terminal */
};

/* What every child running user code shares (one-shot, pre-started, REPL driver): the
 * interpreter of `language` on `script`, the sandbox user and its limits when the agent drops
 * privileges, cwd in the home directory (a template's root and working directory in template
 * mode, / for the builder), envp, output on the two pipe write ends. The caller adds the inline
 * bootstrap or the control/go fds. The interpreter must exist (sbx_mode_allows). */
struct sbx_spawn sbx_user_spawn(const struct sbx_config *cfg, uint8_t language, const char *script,
				char *const *envp, int stdout_fd, int stderr_fd);

/* The two output pipes of user code, close-on-exec; the agent's read ends (out[0], err[0]) are
 * non-blocking, the child's write ends ordinary blocking ones. 0, or -errno with nothing left
 * open. */
int sbx_output_pipes(int out[2], int err[2]);

/* Fork and exec. Returns 0 with *pid once execve() has succeeded (the child is then the leader of
 * its own session and process group, pgid == pid), or a negative errno with a description of the
 * failed step in err. */
int sbx_spawn(const struct sbx_spawn *s, pid_t *pid, char *err, size_t err_size);

/* The clean environment of user code plus the request's variables (req may be NULL: none), which
 * override. In template mode the template's variables come over the agent's defaults (PATH
 * included) but for HOME, USER and the CA bundle's (which the network needs), and the sandbox's
 * matplotlib backend is left out (the template's python has no sandbox runtime); in builder mode
 * HOME is /root and USER root. NULL-terminated; release with sbx_env_free. */
int sbx_env_build(const struct sbx_config *cfg, const struct sbx_exec_request *req,
		  char ***envp_out);
void sbx_env_free(char **envp);

#endif /* SBX_SPAWN_H */
