/* Starting user code: see spawn.h.
 *
 * Exec failure is learnt through a close-on-exec pipe: the child writes {step, errno} to it when a
 * step fails; a successful execve() closes it, so the parent reads EOF. That makes "could not start"
 * (ERROR SPAWN) distinct from "started and exited 127".
 */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "cleanup.h"
#include "host_socket.h"
#include "net_trust.h"

enum spawn_step {
	STEP_SETSID,
	STEP_SIGNALS,
	STEP_STDIN,
	STEP_STDOUT,
	STEP_CONTROL,
	STEP_CLOSE_FDS,
	STEP_RLIMIT,
	STEP_SCHED,
	STEP_CHROOT,
	STEP_SETGROUPS,
	STEP_SETGID,
	STEP_SETUID,
	STEP_UID_CHECK,
	STEP_PRCTL,
	STEP_CHDIR,
	STEP_EXEC,
};

static const char *const step_names[] = {
	[STEP_SETSID] = "setsid",         [STEP_SIGNALS] = "signal reset",
	[STEP_STDIN] = "stdin",           [STEP_STDOUT] = "stdout/stderr",
	[STEP_CONTROL] = "control fds",
	[STEP_CLOSE_FDS] = "close fds",   [STEP_RLIMIT] = "setrlimit",
	[STEP_SCHED] = "sched_setscheduler",
	[STEP_CHROOT] = "chroot into the template",
	[STEP_SETGROUPS] = "setgroups",   [STEP_SETGID] = "setgid",
	[STEP_SETUID] = "setuid",         [STEP_UID_CHECK] = "credential check",
	[STEP_PRCTL] = "prctl",           [STEP_CHDIR] = "chdir",
	[STEP_EXEC] = "execve",
};

struct spawn_report {
	int32_t step;
	int32_t err;
};

/* In the child: tell the parent which step failed, and die. Only async-signal-safe calls. */
__attribute__((noreturn)) static void child_fail(int report_fd, enum spawn_step step, int err)
{
	struct spawn_report r = {(int32_t)step, err ? err : EINVAL};
	ssize_t w = write(report_fd, &r, sizeof(r)); /* <= PIPE_BUF: atomic */
	(void)w;
	_exit(127);
}

/* Close every fd from `first` on except `keep` (>= first). */
static int close_fds_except(int first, int keep)
{
	/* Everything the agent holds (channel, signalfd, timerfd, pipes) must not leak into user
	 * code. close_range needs Linux 5.9; fall back to a loop for old test hosts. */
	if ((keep == first || close_range((unsigned)first, (unsigned)keep - 1, 0) == 0) &&
	    close_range((unsigned)keep + 1, ~0u, 0) == 0)
		return 0;
	if (errno != ENOSYS)
		return -errno;
	for (int fd = first; fd < 65536; fd++)
		if (fd != keep)
			close(fd);
	return 0;
}

/* A REPL driver's control pipes go to fds 3 and 4. Everything is first moved above them (the
 * report pipe too), so that no dup2() clobbers an fd still needed. Returns the new report fd. */
static int place_control_fds(const struct sbx_spawn *s, int report_fd)
{
	int hi_report = fcntl(report_fd, F_DUPFD_CLOEXEC, 64);
	if (hi_report < 0)
		child_fail(report_fd, STEP_CONTROL, errno);
	int hi_in = fcntl(s->control_in_fd, F_DUPFD_CLOEXEC, 64);
	int hi_out = fcntl(s->control_out_fd, F_DUPFD_CLOEXEC, 64);
	if (hi_in < 0 || hi_out < 0 || dup2(hi_in, 3) < 0 || dup2(hi_out, 4) < 0)
		child_fail(hi_report, STEP_CONTROL, errno);
	return hi_report;
}

/* A pre-started interpreter's go pipe goes to fd 3, the same way. Returns the new report fd. */
static int place_go_fd(const struct sbx_spawn *s, int report_fd)
{
	int hi_report = fcntl(report_fd, F_DUPFD_CLOEXEC, 64);
	if (hi_report < 0)
		child_fail(report_fd, STEP_CONTROL, errno);
	int hi_go = fcntl(s->go_fd, F_DUPFD_CLOEXEC, 64);
	if (hi_go < 0 || dup2(hi_go, 3) < 0)
		child_fail(hi_report, STEP_CONTROL, errno);
	return hi_report;
}

static int set_limit(__rlimit_resource_t resource, rlim_t value)
{
	struct rlimit rl;
	if (getrlimit(resource, &rl) < 0)
		return -errno;
	/* Never try to raise the hard limit: that fails for a non-root test run. */
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < value)
		value = rl.rlim_max;
	rl.rlim_cur = rl.rlim_max = value;
	return setrlimit(resource, &rl) < 0 ? -errno : 0;
}

/* execve() takes char *const[] for historical reasons; it does not write to the strings. */
static char *unconst(const char *s)
{
	return (char *)(uintptr_t)s;
}

/* execvpe() with the PATH of envp (glibc's takes the caller's): each directory in turn; the
 * error reported is EACCES if one of them refused, else the last one's. */
__attribute__((noreturn)) static void exec_in_path(char *const *argv, char *const *envp,
						  int report_fd)
{
	const char *file = argv[0];
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		child_fail(report_fd, STEP_EXEC, errno);
	}
	const char *path = "/usr/local/bin:/usr/bin:/bin";
	for (char *const *e = envp; *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0)
			path = *e + 5;
	size_t flen = strlen(file);
	int err = ENOENT;
	bool denied = false;
	for (const char *p = path;; p++) {
		const char *colon = strchrnul(p, ':');
		size_t dlen = (size_t)(colon - p);
		char full[4096];
		/* An empty entry is the working directory, as for execvp(). */
		if (dlen + 1 + flen < sizeof(full)) {
			memcpy(full, dlen ? p : ".", dlen ? dlen : 1);
			size_t at = dlen ? dlen : 1;
			full[at] = '/';
			memcpy(full + at + 1, file, flen + 1);
			execve(full, argv, envp);
			err = errno;
			if (err == EACCES)
				denied = true;
			else if (err != ENOENT && err != ENOTDIR)
				break;
		}
		if (*colon == '\0')
			break;
		p = colon;
	}
	child_fail(report_fd, STEP_EXEC, denied && (err == ENOENT || err == ENOTDIR) ? EACCES : err);
}

__attribute__((noreturn)) static void child_main(const struct sbx_spawn *s, int report_fd)
{
	/* Own session and process group: the agent kills the whole group at the end, and no
	 * controlling terminal can reach it. */
	if (setsid() < 0)
		child_fail(report_fd, STEP_SETSID, errno);

	/* The agent blocks SIGCHLD/SIGIO and ignores SIGPIPE; both survive exec, so undo them. */
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		sigaction(sig, &sa, NULL); /* fails harmlessly for SIGKILL/SIGSTOP/glibc-reserved */
	sigset_t none;
	sigemptyset(&none);
	if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
		child_fail(report_fd, STEP_SIGNALS, errno);

	/* fds 0-2 of the agent are always open (sbx_ensure_std_fds), so every fd here is >= 3 and
	 * the dup2() calls cannot clobber one another. */
	int null_fd = s->with_stdin ? s->stdin_fd : open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0)
		child_fail(report_fd, STEP_STDIN, errno);
	/* A terminal's process: the slave becomes the controlling terminal of the new session. */
	if (s->ctty && ioctl(STDIN_FILENO, TIOCSCTTY, 0) < 0)
		child_fail(report_fd, STEP_STDIN, errno);
	if (dup2(s->stdout_fd, STDOUT_FILENO) < 0 || dup2(s->stderr_fd, STDERR_FILENO) < 0)
		child_fail(report_fd, STEP_STDOUT, errno);
	int first_closed = 3;
	if (s->with_control) {
		report_fd = place_control_fds(s, report_fd);
		first_closed = 5;
	} else if (s->with_go) {
		report_fd = place_go_fd(s, report_fd);
		first_closed = 4;
	}
	int rc = close_fds_except(first_closed, report_fd);
	if (rc < 0)
		child_fail(report_fd, STEP_CLOSE_FDS, -rc);

	if ((rc = set_limit(RLIMIT_NOFILE, 4096)) < 0 || (rc = set_limit(RLIMIT_CORE, 0)) < 0 ||
	    (s->limit_nproc && (rc = set_limit(RLIMIT_NPROC, 256)) < 0))
		child_fail(report_fd, STEP_RLIMIT, -rc);

	/* User code runs SCHED_BATCH, the agent SCHED_OTHER. A SCHED_BATCH task's wake-ups never
	 * preempt the running task: on the one vCPU a client the agent sends to is woken but lets
	 * the agent finish its batch first (each switch between two processes is dear under TCG: it
	 * flushes the emulated TLB). The agent's own wake-ups still preempt: while user code is
	 * CPU-bound, a request, a frame or a client's bytes are handled at once rather than at the
	 * next tick (HZ=100: up to 10 ms; docs/benchmarks.md "The agent beside CPU-bound user code").
	 * Time slices are unchanged: user code may go back to SCHED_OTHER, and gains nothing on the
	 * agent by it. Only from SCHED_OTHER (the agent's in the VM, as root): a test agent started
	 * under another policy passes that on, since leaving SCHED_IDLE unprivileged fails. */
	if (sched_getscheduler(0) == SCHED_OTHER &&
	    sched_setscheduler(0, SCHED_BATCH, &(struct sched_param){.sched_priority = 0}) < 0)
		child_fail(report_fd, STEP_SCHED, errno);

	/* Into the template's tree while still root (chroot needs it); no_new_privs, the uid switch
	 * and the lack of CAP_SYS_CHROOT afterwards leave no way back out. */
	if (s->root && (chroot(s->root) < 0 || chdir("/") < 0))
		child_fail(report_fd, STEP_CHROOT, errno);

	if (s->drop_privileges) {
		/* Groups first, uid last: after setuid() nothing else could be dropped. */
		if (setgroups(0, NULL) < 0)
			child_fail(report_fd, STEP_SETGROUPS, errno);
		if (setgid(SBX_USER_GID) < 0)
			child_fail(report_fd, STEP_SETGID, errno);
		if (setuid(SBX_USER_UID) < 0)
			child_fail(report_fd, STEP_SETUID, errno);
		/* Belt and braces: the switch must be total and irreversible. */
		if (getuid() != SBX_USER_UID || geteuid() != SBX_USER_UID ||
		    getgid() != SBX_USER_GID || getegid() != SBX_USER_GID || setuid(0) == 0)
			child_fail(report_fd, STEP_UID_CHECK, EPERM);
	}
	/* No set-uid binary can give privileges back; and a test-mode child dies with the agent
	 * (set after the uid switch, which clears the parent-death signal). */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		child_fail(report_fd, STEP_PRCTL, errno);
	/* As the user: a working directory it cannot enter is one it does not get. */
	if (chdir(s->home) < 0 && (!s->home_fallback || chdir(s->home_fallback) < 0))
		child_fail(report_fd, STEP_CHDIR, errno);
	umask(022);

	if (s->argv)
		exec_in_path(s->argv, s->envp, report_fd);
	const char *base = strrchr(s->interpreter, '/');
	char *argv[7];
	size_t argc = 0;
	argv[argc++] = unconst(base ? base + 1 : s->interpreter);
	if (s->opt) {
		argv[argc++] = unconst(s->opt);
		argv[argc++] = unconst(s->opt_value);
	}
	if (s->inline_flag) {
		argv[argc++] = unconst(s->inline_flag);
		argv[argc++] = unconst(s->inline_code);
	}
	argv[argc++] = unconst(s->script);
	argv[argc] = NULL;
	execve(s->interpreter, argv, s->envp);
	child_fail(report_fd, STEP_EXEC, errno);
}

int sbx_spawn(const struct sbx_spawn *s, pid_t *pid_out, char *err, size_t err_size)
{
	int report[2];
	if (pipe2(report, O_CLOEXEC) < 0) {
		int e = errno;
		snprintf(err, err_size, "pipe: %s", strerror(e));
		return -e;
	}
	_cleanup_close_ int report_r = report[0];
	_cleanup_close_ int report_w = report[1];

	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		snprintf(err, err_size, "fork: %s", strerror(e));
		return -e;
	}
	if (pid == 0)
		child_main(s, report_w);

	sbx_close_fd(&report_w);
	struct spawn_report r;
	ssize_t n;
	do
		n = read(report_r, &r, sizeof(r));
	while (n < 0 && errno == EINTR);
	if (n == 0) {
		*pid_out = pid;
		return 0;
	}
	/* The child failed before or at execve and has _exit()ed (or is about to): reap it here so
	 * that the reaper never sees a pid it does not know. */
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	if (n != (ssize_t)sizeof(r) || r.step < 0 || r.step > STEP_EXEC || r.err <= 0) {
		snprintf(err, err_size, "child failed before exec (bad report)");
		return -EIO;
	}
	if (r.step == STEP_EXEC)
		snprintf(err, err_size, "execve %s: %s", s->argv ? s->argv[0] : s->interpreter,
			 strerror(r.err));
	else
		snprintf(err, err_size, "%s: %s", step_names[r.step], strerror(r.err));
	return -r.err;
}

/* --- environment ----------------------------------------------------------------------------- */

void sbx_env_free(char **envp)
{
	if (!envp)
		return;
	for (char **p = envp; *p; p++)
		free(*p);
	free(envp);
}

/* Put "NAME=VALUE" in place of an entry with the same name, or at the end. */
static void env_set(char **envp, size_t *count, char *entry, size_t name_len)
{
	for (size_t i = 0; i < *count; i++) {
		if (strncmp(envp[i], entry, name_len + 1) == 0) {
			free(envp[i]);
			envp[i] = entry;
			return;
		}
	}
	envp[(*count)++] = entry;
}

/* NAME=VALUE strings: the first n_name bytes + '=' name the variable. */
static size_t env_name_len(const char *entry)
{
	const char *eq = strchr(entry, '=');
	return eq ? (size_t)(eq - entry) : strlen(entry);
}

static int env_put(char **envp, size_t *count, const char *entry)
{
	char *e = strdup(entry);
	if (!e)
		return -ENOMEM;
	env_set(envp, count, e, env_name_len(e));
	return 0;
}

int sbx_env_build(const struct sbx_config *cfg, const struct sbx_exec_request *req,
		  char ***envp_out)
{
	static const char *const base[] = {
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"LOGNAME=user",
		"LANG=C.UTF-8",
		"TMPDIR=/tmp",
		"PYTHONUNBUFFERED=1",
		"PYTHONDONTWRITEBYTECODE=1",
	};
	/* matplotlib's figures become outputs (guest/runtime/python): the image's python only. */
	static const char mpl[] = "MPLBACKEND=module://exec_sandbox_guest.mpl_backend";
	/* One CA bundle for every client (net_trust.h): the image's, or the host's once NET_CONFIG
	 * brought it. Fixed paths, filled later: interpreters started before NET_CONFIG read the
	 * right file when they first need it. */
	static const char *const trust[] = {
		"SSL_CERT_FILE=" SBX_NET_CA_FILE,
		"REQUESTS_CA_BUNDLE=" SBX_NET_CA_FILE,
		"PIP_CERT=" SBX_NET_CA_FILE,
		"NODE_EXTRA_CA_CERTS=" SBX_NET_NODE_CA_FILE,
	};
	const size_t n_trust = sbx_net_trust_ready() ? sizeof(trust) / sizeof(trust[0]) : 0;
	const size_t n_base = sizeof(base) / sizeof(base[0]);
	const bool tpl = cfg->tpl.active;
	const size_t n_tpl = tpl ? cfg->tpl.env_count : 0;
	const uint32_t n_req = req ? req->env_count : 0;
	/* The runtimes' host socket, named only where it is not at its default (test mode). */
	const char *host_socket = sbx_host_socket_env();
	char **envp = calloc(n_base + 1 + n_tpl + 2 + n_trust + 1 + n_req + 1, sizeof(char *));
	if (!envp)
		return -ENOMEM;
	size_t count = 0;
	char home[300], user[16];
	snprintf(home, sizeof(home), "HOME=%s", cfg->builder ? "/root" : cfg->home_dir);
	snprintf(user, sizeof(user), "USER=%s", cfg->builder ? "root" : "user");
	for (size_t i = 0; i < n_base; i++)
		if (env_put(envp, &count, base[i]) < 0)
			goto oom;
	if (!tpl && env_put(envp, &count, mpl) < 0)
		goto oom;
	for (size_t i = 0; i < n_tpl; i++)
		if (env_put(envp, &count, cfg->tpl.env[i]) < 0)
			goto oom;
	if (env_put(envp, &count, home) < 0 || env_put(envp, &count, user) < 0)
		goto oom;
	for (size_t i = 0; i < n_trust; i++)
		if (env_put(envp, &count, trust[i]) < 0)
			goto oom;
	if (host_socket && env_put(envp, &count, host_socket) < 0)
		goto oom;
	for (uint32_t i = 0; i < n_req; i++) {
		const struct sbx_env_var *v = &req->env[i];
		size_t len = (size_t)v->name_len + 1 + v->value_len;
		char *e = malloc(len + 1);
		if (!e)
			goto oom;
		memcpy(e, v->name, v->name_len);
		e[v->name_len] = '=';
		if (v->value_len)
			memcpy(e + v->name_len + 1, v->value, v->value_len);
		e[len] = '\0';
		env_set(envp, &count, e, v->name_len);
	}
	*envp_out = envp;
	return 0;
oom:
	sbx_env_free(envp);
	return -ENOMEM;
}

/* The image's node with its startup snapshot when the VM has one (cfg->node_snapshot): a regular
 * file, not a link. Only in the VM (a host test's node is another build, which the blob does not
 * load into). Checked at each start: the template makes it after boot. */
static bool use_node_snapshot(const struct sbx_config *cfg, uint8_t language)
{
	struct stat st;
	return cfg->boot && cfg->drop_privileges && !cfg->tpl.active && language == SBX_LANG_JAVASCRIPT &&
	       strcmp(cfg->interpreter[language], SBX_NODE_BINARY) == 0 &&
	       lstat(cfg->node_snapshot, &st) == 0 && S_ISREG(st.st_mode);
}

struct sbx_spawn sbx_user_spawn(const struct sbx_config *cfg, uint8_t language, const char *script,
				char *const *envp, int stdout_fd, int stderr_fd)
{
	bool snapshot = use_node_snapshot(cfg, language);
	return (struct sbx_spawn){
		.interpreter = cfg->interpreter[language],
		.opt = snapshot ? "--snapshot-blob" : NULL,
		.opt_value = snapshot ? cfg->node_snapshot : NULL,
		.script = script,
		.root = cfg->tpl.active ? cfg->tpl.root : NULL,
		.home = cfg->builder ? "/" : cfg->tpl.active ? cfg->tpl.workdir : cfg->home_dir,
		.home_fallback = cfg->tpl.active ? SBX_HOME_DIR : NULL,
		.envp = envp,
		.drop_privileges = cfg->drop_privileges,
		.limit_nproc = cfg->drop_privileges,
		.stdout_fd = stdout_fd,
		.stderr_fd = stderr_fd,
	};
}

int sbx_output_pipes(int out[2], int err[2])
{
	out[0] = out[1] = err[0] = err[1] = -1;
	if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
		int e = errno;
		int *fds[] = {&out[0], &out[1], &err[0], &err[1]};
		for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
			sbx_close_fd(fds[i]);
		return -e;
	}
	fcntl(out[0], F_SETFL, O_NONBLOCK);
	fcntl(err[0], F_SETFL, O_NONBLOCK);
	return 0;
}
