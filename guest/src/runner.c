/* Execution lifecycle: see runner.h. */
#include "runner.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap.h"
#include "cleanup.h"
#include "host_socket.h"
#include "procs.h"
#include "spawn.h"

#define TERM_GRACE_MS 500u
/* How long PRESTART waits for the interpreter to reach its bootstrap's wait. */
#define PRESTART_READY_MS 30000
#define DRAIN_MS 200u
/* Reads per pipe in the final drain: bounds the work when a survivor keeps writing. */
#define FINAL_DRAIN_READS 64

/* Inline bootstraps (`-c CODE`); node's is a preload file beside the REPL drivers instead
 * (`-r guest/repl/prestart.js`), so that node's own entry point runs the script after it. */
static const char *const bootstraps[] = {
	[SBX_LANG_PYTHON] = sbx_bootstrap_python,
	[SBX_LANG_RAW] = sbx_bootstrap_raw,
};

static const char *const script_names[] = {
	[SBX_LANG_PYTHON] = "main.py",
	[SBX_LANG_JAVASCRIPT] = "main.js",
	[SBX_LANG_RAW] = "main.sh",
};

/* ms == 0 disarms: that is what the callers mean by it. */
static void arm_timer(struct sbx_runner *r, uint64_t ms)
{
	sbx_timer_arm(r->timer_fd, ms);
}

static void kill_group(struct sbx_runner *r, int sig)
{
	/* Process group == main child's pid (setsid). It stays reserved while the leader is unreaped;
	 * after that the group is killed once, at once, and never again. */
	if (r->pid > 0 && kill(-r->pid, sig) < 0 && errno != ESRCH)
		sbx_log("kill(-%d, %d): %s", (int)r->pid, sig, strerror(errno));
}

/* In the sweep's helper: whether process `pid` is to be left alone: of a spared session, or
 * dead. */
static bool spared(const char *pid, const pid_t *keep, size_t n_keep)
{
	char path[64], stat[512];
	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true; /* gone already */
	ssize_t n = read(fd, stat, sizeof(stat) - 1);
	if (n <= 0)
		return true;
	stat[n] = '\0';
	/* "pid (comm) state ppid pgrp session ...": comm may hold anything, so from its last ')'. */
	const char *rp = strrchr(stat, ')');
	char state;
	int sid;
	if (!rp || sscanf(rp + 1, " %c %*d %*d %d", &state, &sid) != 2)
		return false;
	/* A zombie is dead already (the agent reaps it after the sweep): a pass that "killed" it
	 * would only call for another pass. */
	if (state == 'Z' || state == 'X')
		return true;
	for (size_t i = 0; i < n_keep; i++)
		if (keep[i] == sid)
			return true;
	return false;
}

/* One pass over /proc killing what is not spared; returns how many it signalled. */
static int kill_unspared(const pid_t *keep, size_t n_keep)
{
	DIR *d = opendir("/proc");
	if (!d)
		return 0;
	int killed = 0;
	pid_t self = getpid();
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end != '\0' || pid <= 1 || pid == self)
			continue;
		/* As uid 1000: processes of other users refuse (EPERM). */
		if (!spared(e->d_name, keep, n_keep) && kill((pid_t)pid, SIGKILL) == 0)
			killed++;
	}
	closedir(d);
	return killed;
}

/* Kill every process of uid 1000, whatever session it escaped to: kill(-1) from a process with that
 * uid reaches exactly those (never PID 1). The background processes' sessions are spared
 * (procs.h): then the helper walks /proc instead, killing each uid-1000 process of any other
 * session, pass after pass until one finds nothing (a process cannot move into a spared session:
 * setsid() only makes a new one). Only in the VM: on a test host it would hit real users. */
void sbx_kill_user_processes(const struct sbx_config *cfg)
{
	if (!cfg->drop_privileges)
		return;
	static pid_t keep[SBX_PROC_TRACKED_MAX];
	size_t n_keep = sbx_procs_sessions(keep, SBX_PROC_TRACKED_MAX);
	pid_t pid = fork();
	if (pid < 0) {
		sbx_log("fork for cleanup: %s", strerror(errno));
		return;
	}
	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(SBX_USER_GID) != 0 || setuid(SBX_USER_UID) != 0)
			_exit(1);
		/* Repeated: a process that was mid-fork during one pass can leave a child the pass
		 * did not see. */
		if (n_keep == 0) {
			for (int i = 0; i < 3; i++)
				kill(-1, SIGKILL);
		} else {
			/* RLIMIT_NPROC bounds what a fork loop can make between passes. */
			for (int i = 0; i < 64 && kill_unspared(keep, n_keep) > 0; i++)
				;
		}
		_exit(0);
	}
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

int sbx_write_code_file(const char *path, const uint8_t *code, size_t len)
{
	/* Unlink first: the old file is read-only, and O_EXCL|O_NOFOLLOW then guarantees a fresh
	 * regular file even if something had been planted at the path. */
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
	if (fd < 0)
		return -errno;
	while (len > 0) {
		ssize_t n = write(fd, code, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		code += n;
		len -= (size_t)n;
	}
	/* Readable by uid 1000, writable by nobody (it is root-owned, in a root-owned directory). */
	if (fchmod(fd, 0444) < 0)
		return -errno;
	if (close(TAKE_FD(fd)) < 0)
		return -errno;
	return 0;
}

int sbx_runner_init(struct sbx_runner *r, const struct sbx_config *cfg, struct sbx_channel *ch)
{
	memset(r, 0, sizeof(*r));
	r->cfg = cfg;
	r->ch = ch;
	r->out.fd = r->err.fd = -1;
	r->done_fd = -1;
	r->pre.go_fd = r->pre.out_fd = r->pre.err_fd = -1;
	r->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (r->timer_fd < 0)
		return -errno;
	return 0;
}

bool sbx_runner_busy(const struct sbx_runner *r)
{
	return r->phase != SBX_PHASE_IDLE;
}

static void stream_init(struct sbx_stream *s, int fd, uint8_t type, uint32_t flag, uint32_t limit)
{
	s->fd = fd;
	s->msg_type = type;
	s->limit_flag = flag;
	s->limit = limit;
	s->total = 0;
}


static void forget_prestarted(struct sbx_runner *r)
{
	sbx_close_fd(&r->pre.go_fd);
	sbx_close_fd(&r->pre.out_fd);
	sbx_close_fd(&r->pre.err_fd);
	r->pre.pid = 0;
}

void sbx_runner_discard_prestarted(struct sbx_runner *r)
{
	if (r->pre.pid <= 0)
		return;
	/* Killed before its go pipe closes: it never runs anything. The reaper then sees a pid it
	 * does not know, which it ignores. */
	if (kill(-r->pre.pid, SIGKILL) < 0 && errno != ESRCH)
		sbx_log("kill(-%d): %s", (int)r->pre.pid, strerror(errno));
	forget_prestarted(r);
}

int sbx_runner_prestart(struct sbx_runner *r, uint8_t language, uint32_t *code, char *msg,
			size_t msg_size)
{
	if (sbx_runner_busy(r)) {
		*code = SBX_ERR_BUSY;
		snprintf(msg, msg_size, "an execution is already running");
		return -EBUSY;
	}
	if (!sbx_language_valid(language)) {
		*code = SBX_ERR_BAD_REQUEST;
		snprintf(msg, msg_size, "unknown language %u", language);
		return -EINVAL;
	}
	sbx_runner_discard_prestarted(r);
	*code = SBX_ERR_INTERNAL;
	/* The code file's path is its argument, as in the one-shot run (argv, tracebacks). */
	char script[sizeof(r->code_path)];
	int n = snprintf(script, sizeof(script), "%s/%s", r->cfg->run_dir, script_names[language]);
	if (n < 0 || (size_t)n >= sizeof(script)) {
		snprintf(msg, msg_size, "code path too long");
		return -ENAMETOOLONG;
	}
	char preload[sizeof(r->cfg->driver_dir) + 16];
	n = snprintf(preload, sizeof(preload), "%s/prestart.js",
		     r->cfg->driver_dir[0] ? r->cfg->driver_dir : SBX_LIB_DIR);
	if (n < 0 || (size_t)n >= sizeof(preload)) {
		snprintf(msg, msg_size, "preload path too long");
		return -ENAMETOOLONG;
	}
	/* The clean environment of a request without variables: only such requests use it. */
	char **envp = NULL;
	int rc = sbx_env_build(r->cfg, NULL, &envp);
	if (rc < 0) {
		snprintf(msg, msg_size, "building environment: %s", strerror(-rc));
		return rc;
	}
	/* go: a socket pair, fd 3 of the child. The bootstrap writes its ready byte once it waits
	 * for the go (its interpreter has started), the agent writes the go (runner.h). */
	int out[2], err[2], go[2];
	rc = sbx_output_pipes(out, err);
	if (rc == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, go) < 0) {
		rc = -errno;
		close(out[0]);
		close(out[1]);
		close(err[0]);
		close(err[1]);
	}
	if (rc < 0) {
		snprintf(msg, msg_size, "pipe: %s", strerror(-rc));
		sbx_env_free(envp);
		return rc;
	}
	struct sbx_spawn sp = sbx_user_spawn(r->cfg, language, script, envp, out[1], err[1]);
	bool node = language == SBX_LANG_JAVASCRIPT;
	sp.inline_code = node ? preload : bootstraps[language];
	sp.inline_flag = node ? "-r" : "-c";
	sp.with_go = true;
	sp.go_fd = go[0];
	pid_t pid;
	rc = sbx_spawn(&sp, &pid, msg, msg_size);
	close(out[1]);
	close(err[1]);
	close(go[0]);
	sbx_env_free(envp);
	if (rc < 0) {
		close(out[0]);
		close(err[0]);
		close(go[1]);
		*code = SBX_ERR_SPAWN;
		return rc;
	}
	r->pre = (struct sbx_prestarted){
		.pid = pid, .language = language, .go_fd = go[1], .out_fd = out[0], .err_fd = err[0]};
	/* Answer only once the interpreter waits: a pool hit must not pay the rest of its start-up.
	 * The agent blocks meanwhile (node: ~2 s under TCG); nothing else runs in this VM then, and
	 * the wait is bounded. A bootstrap that died gives EOF at once. */
	struct pollfd p = {.fd = go[1], .events = POLLIN};
	int ready;
	do
		ready = poll(&p, 1, PRESTART_READY_MS);
	while (ready < 0 && errno == EINTR);
	char c = 0;
	ssize_t got = ready > 0 ? read(go[1], &c, 1) : 0;
	if (got != 1 || (c != 'r' && c != 'n')) {
		sbx_runner_discard_prestarted(r);
		*code = SBX_ERR_SPAWN;
		snprintf(msg, msg_size, "the pre-started interpreter did not get ready%s",
			 ready == 0 ? " in time" : "");
		return -EIO;
	}
	r->pre.refreshable = c == 'r';
	return 0;
}

void sbx_runner_note_reseed(struct sbx_runner *r)
{
	if (r->pre.pid <= 0)
		return;
	if (r->pre.refreshable)
		r->pre.reseeded = true;
	else
		sbx_runner_discard_prestarted(r);
}

/* Write the go (runner.h) to the waiting interpreter; one that cannot take it is discarded. */
static int send_go(struct sbx_runner *r, const char *go, size_t n)
{
	ssize_t w;
	do
		w = write(r->pre.go_fd, go, n);
	while (w < 0 && errno == EINTR);
	if (w == (ssize_t)n)
		return 0;
	int e = w < 0 ? errno : EIO;
	sbx_runner_discard_prestarted(r);
	return -e;
}

pid_t sbx_runner_hand_over(struct sbx_runner *r, uint8_t language, const char *driver_path,
			   int *control_fd)
{
	if (r->pre.pid <= 0 || r->pre.language != language || language != SBX_LANG_JAVASCRIPT)
		return 0;
	char go[320];
	int n = snprintf(go, sizeof(go), "%c%s\n", r->pre.reseeded ? '4' : '3', driver_path);
	if (n < 0 || (size_t)n >= sizeof(go) || strchr(driver_path, '\n') != NULL ||
	    send_go(r, go, (size_t)n) < 0)
		return 0;
	/* Its stdout and stderr are /dev/null from now on (the bootstrap puts it there first), then
	 * each request's FIFOs: the one-shot pipes are done with. */
	pid_t pid = r->pre.pid;
	*control_fd = TAKE_FD(r->pre.go_fd);
	forget_prestarted(r);
	return pid;
}

/* Hand the code to the pre-started interpreter: it is already running as the one-shot child. Its
 * go socket becomes *done_fd, where it reports the end of the code. */
static int go_prestarted(struct sbx_runner *r, int out_fd[2], int err_fd[2], int *done_fd, pid_t *pid)
{
	const char go = r->pre.reseeded ? '2' : '1';
	int rc = send_go(r, &go, 1);
	if (rc < 0)
		return rc;
	out_fd[0] = TAKE_FD(r->pre.out_fd);
	err_fd[0] = TAKE_FD(r->pre.err_fd);
	*done_fd = TAKE_FD(r->pre.go_fd);
	fcntl(*done_fd, F_SETFL, O_NONBLOCK);
	*pid = r->pre.pid;
	forget_prestarted(r);
	return 0;
}

/* The preload that gives node the global `tools` (guest/runtime/node/tools_global.js), when
 * the image has it. */
static bool node_tools_preload(const struct sbx_config *cfg, char *path, size_t size)
{
	int n = snprintf(path, size, "%s/tools_global.js",
			 cfg->driver_dir[0] ? cfg->driver_dir : SBX_LIB_DIR);
	return n > 0 && (size_t)n < size && access(path, R_OK) == 0;
}

int sbx_runner_start(struct sbx_runner *r, uint32_t id, const struct sbx_exec_request *req,
		     uint32_t *code, char *msg, size_t msg_size)
{
	if (sbx_runner_busy(r)) {
		*code = SBX_ERR_BUSY;
		snprintf(msg, msg_size, "an execution is already running");
		return -EBUSY;
	}
	int n = snprintf(r->code_path, sizeof(r->code_path), "%s/%s", r->cfg->run_dir,
			 script_names[req->language]);
	if (n < 0 || (size_t)n >= sizeof(r->code_path)) {
		*code = SBX_ERR_INTERNAL;
		snprintf(msg, msg_size, "code path too long");
		return -ENAMETOOLONG;
	}
	/* The pre-started interpreter has the clean environment: a request with variables, or of
	 * another language, gets a fresh process. */
	bool use_pre = r->pre.pid > 0 && r->pre.language == req->language && req->env_count == 0;
	if (!use_pre)
		sbx_runner_discard_prestarted(r);
	*code = SBX_ERR_INTERNAL;
	int rc = sbx_write_code_file(r->code_path, req->code, req->code_len);
	if (rc < 0) {
		snprintf(msg, msg_size, "writing %s: %s", r->code_path, strerror(-rc));
		unlink(r->code_path);
		return rc;
	}
	int out[2], err[2], done_fd = -1;
	pid_t pid;
	if (use_pre) {
		r->start_ns = sbx_now_ns();
		rc = go_prestarted(r, out, err, &done_fd, &pid);
		if (rc == 0)
			goto started;
		/* It died before the go: start afresh, as without it. */
	}
	char **envp = NULL;
	rc = sbx_env_build(r->cfg, req, &envp);
	if (rc < 0) {
		snprintf(msg, msg_size, "building environment: %s", strerror(-rc));
		unlink(r->code_path);
		return rc;
	}
	if ((rc = sbx_output_pipes(out, err)) < 0)
		goto fail_env;
	struct sbx_spawn sp = sbx_user_spawn(r->cfg, req->language, r->code_path, envp, out[1], err[1]);
	/* A node without the pre-start preload still gets the global `tools` its code may use,
	 * from the runtime's own small preload (absent in a host test's tree). */
	char tools_preload[sizeof(r->cfg->driver_dir) + 24];
	if (req->language == SBX_LANG_JAVASCRIPT &&
	    node_tools_preload(r->cfg, tools_preload, sizeof(tools_preload))) {
		sp.inline_flag = "-r";
		sp.inline_code = tools_preload;
	}
	r->start_ns = sbx_now_ns();
	rc = sbx_spawn(&sp, &pid, msg, msg_size);
	close(out[1]);
	close(err[1]);
	sbx_env_free(envp);
	if (rc < 0) {
		close(out[0]);
		close(err[0]);
		unlink(r->code_path);
		*code = SBX_ERR_SPAWN;
		return rc;
	}

started:
	r->phase = SBX_PHASE_RUNNING;
	r->silent = false;
	r->exited = false;
	r->swept = false;
	r->done_fd = done_fd;
	r->id = id;
	r->pid = pid;
	r->status = 0;
	r->flags = 0;
	r->end_ns = 0;
	stream_init(&r->out, out[0], SBX_MSG_STDOUT, SBX_EXIT_STDOUT_LIMIT, req->stdout_limit);
	stream_init(&r->err, err[0], SBX_MSG_STDERR, SBX_EXIT_STDERR_LIMIT, req->stderr_limit);
	arm_timer(r, req->timeout_ms);
	return 0;

fail_env:
	snprintf(msg, msg_size, "pipe: %s", strerror(-rc));
	sbx_env_free(envp);
	unlink(r->code_path);
	return rc;
}

static void finish(struct sbx_runner *r)
{
	sbx_close_fd(&r->out.fd);
	sbx_close_fd(&r->err.fd);
	sbx_close_fd(&r->done_fd);
	arm_timer(r, 0);
	struct sbx_exit e = {.flags = r->flags};
	if (r->flags & SBX_EXIT_TIMED_OUT)
		e.exit_code = -1;
	else if (WIFEXITED(r->status))
		e.exit_code = WEXITSTATUS(r->status);
	else if (WIFSIGNALED(r->status))
		e.exit_code = 128 + WTERMSIG(r->status);
	else
		e.exit_code = -1; /* not reachable: waitpid() without WUNTRACED reports only deaths */
	e.duration_us = (r->end_ns - r->start_ns) / 1000u;
	if (!r->silent) {
		int rc = sbx_channel_send_exit(r->ch, r->id, &e);
		if (rc < 0 && rc != -ENOTCONN)
			sbx_log("sending EXIT: %s", strerror(-rc));
	}
	sbx_exec_ended(r->id);
	/* After the EXIT, so that the sweep (a fork under TCG) costs the next request, not this one;
	 * the next request is read only once this returns. */
	if (!r->swept)
		sbx_kill_user_processes(r->cfg);
	if (unlink(r->code_path) < 0 && errno != ENOENT)
		sbx_log("unlink %s: %s", r->code_path, strerror(errno));
	r->phase = SBX_PHASE_IDLE;
	r->pid = 0;
	r->silent = false;
}

static void maybe_finish(struct sbx_runner *r)
{
	if (r->phase == SBX_PHASE_DRAINING && r->out.fd < 0 && r->err.fd < 0)
		finish(r);
}

/* Forward a chunk read from a pipe, up to the stream's limit; passing it kills the run. */
static void deliver(struct sbx_runner *r, struct sbx_stream *s, const uint8_t *data, size_t n)
{
	bool over = sbx_stream_forward(s, r->ch, r->id, r->silent, data, n);
	if (over && !(r->flags & s->limit_flag)) {
		r->flags |= s->limit_flag;
		if (!r->exited)
			kill_group(r, SIGKILL);
	}
}

/* One read; returns false once the stream is closed or has nothing more right now. */
static bool read_stream(struct sbx_runner *r, struct sbx_stream *s)
{
	static uint8_t buf[SBX_OUTPUT_CHUNK_MAX];
	long n = sbx_stream_read(s, buf, sizeof(buf));
	if (n > 0)
		deliver(r, s, buf, (size_t)n);
	return n > 0;
}

void sbx_runner_on_output(struct sbx_runner *r, struct sbx_stream *s)
{
	if (r->phase == SBX_PHASE_IDLE)
		return;
	read_stream(r, s);
	maybe_finish(r);
}

void sbx_runner_on_child_exit(struct sbx_runner *r, pid_t pid, int status)
{
	if (r->pre.pid > 0 && pid == r->pre.pid) {
		/* The pre-started interpreter died before its go: the next EXEC starts afresh. */
		sbx_log("pre-started interpreter %d died (status %d)", (int)pid, status);
		forget_prestarted(r);
		return;
	}
	if (r->phase == SBX_PHASE_IDLE || r->exited || pid != r->pid)
		return; /* an orphan reparented to PID 1, or a helper: nothing to report */
	r->exited = true;
	r->status = status;
	r->end_ns = sbx_now_ns();
	/* Nothing of a one-shot run survives its main process. */
	kill_group(r, SIGKILL);
	sbx_kill_user_processes(r->cfg);
	r->swept = true;
	/* Its report socket gives EOF now: nothing more to learn there. */
	sbx_close_fd(&r->done_fd);
	r->phase = SBX_PHASE_DRAINING;
	arm_timer(r, DRAIN_MS);
	maybe_finish(r);
}

void sbx_runner_on_done(struct sbx_runner *r)
{
	uint8_t report[2];
	ssize_t n;
	do
		n = read(r->done_fd, report, sizeof(report));
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return;
	/* One report at most. Anything but a well-formed one (EOF: the bootstrap died or the code
	 * closed fd 3; bytes the code wrote there itself) leaves the run to end the usual way, by its
	 * main process's death. A forged report can only end the forger's own run early. */
	sbx_close_fd(&r->done_fd);
	if (r->phase != SBX_PHASE_RUNNING || n != (ssize_t)sizeof(report) || report[0] != 'd')
		return;
	r->exited = true;
	r->status = W_EXITCODE(report[1], 0);
	r->end_ns = sbx_now_ns();
	/* The leader is not reaped yet, so its group id is still its own. */
	kill_group(r, SIGKILL);
	/* The bootstrap flushed before it reported: all the code wrote is in the pipes. */
	for (int i = 0; i < FINAL_DRAIN_READS && read_stream(r, &r->out); i++)
		;
	for (int i = 0; i < FINAL_DRAIN_READS && read_stream(r, &r->err); i++)
		;
	finish(r);
}

void sbx_runner_on_timer(struct sbx_runner *r)
{
	uint64_t ticks;
	if (read(r->timer_fd, &ticks, sizeof(ticks)) != (ssize_t)sizeof(ticks))
		return; /* stale readiness: the timer was re-armed or disarmed since */
	switch (r->phase) {
	case SBX_PHASE_RUNNING:
		r->flags |= SBX_EXIT_TIMED_OUT;
		kill_group(r, SIGTERM);
		kill_group(r, SIGCONT); /* a stopped process must run to act on SIGTERM */
		r->phase = SBX_PHASE_TERM_GRACE;
		arm_timer(r, TERM_GRACE_MS);
		break;
	case SBX_PHASE_TERM_GRACE:
		kill_group(r, SIGKILL);
		r->phase = SBX_PHASE_KILLED;
		break;
	case SBX_PHASE_DRAINING:
		/* Out of patience with whoever holds the pipes: take what is buffered, then report. */
		for (int i = 0; i < FINAL_DRAIN_READS && read_stream(r, &r->out); i++)
			;
		for (int i = 0; i < FINAL_DRAIN_READS && read_stream(r, &r->err); i++)
			;
		finish(r);
		break;
	case SBX_PHASE_IDLE:
	case SBX_PHASE_KILLED:
		break;
	}
}

void sbx_runner_abort(struct sbx_runner *r)
{
	if (r->phase == SBX_PHASE_IDLE)
		return;
	r->silent = true;
	if (!r->exited)
		kill_group(r, SIGKILL);
}
