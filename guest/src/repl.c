/* Session REPL lifecycle: see repl.h. */
#include "repl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "spawn.h"

/* Reads per pipe when draining after a completion or the REPL's death: bounds the work when a
 * survivor keeps writing. 64 reads of 32 KiB cover a full pipe many times over. */
#define DRAIN_READS 64
/* After SIGKILL the driver dies at once; this only guards against a reaper that never hears. */
#define KILL_WAIT_MS 2000u

static const char *const driver_names[] = {
	[SBX_LANG_PYTHON] = "driver.py",
	[SBX_LANG_JAVASCRIPT] = "driver.js",
	[SBX_LANG_RAW] = "driver.sh",
};

static void arm(struct sbx_repl *r, uint64_t ms)
{
	sbx_timer_arm(r->timer_fd, ms);
}

int sbx_repl_init(struct sbx_repl *r, const struct sbx_config *cfg, struct sbx_channel *ch)
{
	memset(r, 0, sizeof(*r));
	r->cfg = cfg;
	r->ch = ch;
	r->driver_dir = cfg->driver_dir[0] ? cfg->driver_dir : SBX_REPL_DIR;
	r->control_w = r->control_r = r->out.fd = r->err.fd = -1;
	r->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (r->timer_fd < 0)
		return -errno;
	snprintf(r->code_path, sizeof(r->code_path), "%s/session-code", cfg->run_dir);
	snprintf(r->env_path, sizeof(r->env_path), "%s/session-env", cfg->run_dir);
	return 0;
}

bool sbx_repl_busy(const struct sbx_repl *r)
{
	return r->phase != SBX_REPL_IDLE;
}

static void close_fds(struct sbx_repl *r)
{
	sbx_close_fd(&r->control_w);
	sbx_close_fd(&r->control_r);
	sbx_close_fd(&r->out.fd);
	sbx_close_fd(&r->err.fd);
	r->line_len = 0;
}

/* Start the driver for `language`. Its base environment is the clean one of one-shot code; each
 * request's variables are applied by the driver. */
static int spawn_driver(struct sbx_repl *r, uint8_t language, char *msg, size_t msg_size)
{
	char script[300];
	int n = snprintf(script, sizeof(script), "%s/%s", r->driver_dir, driver_names[language]);
	if (n < 0 || (size_t)n >= sizeof(script)) {
		snprintf(msg, msg_size, "driver path too long");
		return -ENAMETOOLONG;
	}
	char **envp = NULL;
	int rc = sbx_env_build(NULL, r->cfg->home_dir, &envp);
	if (rc < 0) {
		snprintf(msg, msg_size, "building environment: %s", strerror(-rc));
		return rc;
	}
	int out[2] = {-1, -1}, err[2] = {-1, -1}, cin[2] = {-1, -1}, cout[2] = {-1, -1};
	rc = sbx_output_pipes(out, err);
	if (rc == 0 && (pipe2(cin, O_CLOEXEC) < 0 || pipe2(cout, O_CLOEXEC) < 0))
		rc = -errno;
	if (rc < 0) {
		snprintf(msg, msg_size, "pipe: %s", strerror(-rc));
		goto fail;
	}
	struct sbx_spawn sp = sbx_user_spawn(r->cfg, language, script, envp, out[1], err[1]);
	sp.with_control = true;
	sp.control_in_fd = cin[0];
	sp.control_out_fd = cout[1];
	pid_t pid;
	rc = sbx_spawn(&sp, &pid, msg, msg_size);
	if (rc < 0)
		goto fail;
	sbx_env_free(envp);
	close(out[1]);
	close(err[1]);
	close(cin[0]);
	close(cout[1]);
	/* The agent's ends never block: a REPL that stops reading must not stall PID 1. */
	fcntl(cin[1], F_SETFL, O_NONBLOCK);
	fcntl(cout[0], F_SETFL, O_NONBLOCK);
	r->pid = pid;
	r->language = language;
	r->control_w = cin[1];
	r->control_r = cout[0];
	r->out.fd = out[0];
	r->err.fd = err[0];
	r->out.msg_type = SBX_MSG_STDOUT;
	r->out.limit_flag = SBX_EXIT_STDOUT_LIMIT;
	r->err.msg_type = SBX_MSG_STDERR;
	r->err.limit_flag = SBX_EXIT_STDERR_LIMIT;
	r->line_len = 0;
	return 0;
fail:
	sbx_env_free(envp);
	int *fds[] = {out, err, cin, cout};
	for (size_t i = 0; i < 4; i++)
		for (int j = 0; j < 2; j++)
			if (fds[i][j] >= 0)
				close(fds[i][j]);
	return rc;
}

/* Kill the REPL and everything the user started; the pid is reaped by the event loop later. */
static void kill_repl(struct sbx_repl *r)
{
	if (r->pid > 0 && kill(-r->pid, SIGKILL) < 0 && errno != ESRCH)
		sbx_log("kill(-%d): %s", (int)r->pid, strerror(errno));
	sbx_kill_user_processes(r->cfg);
}

/* The request's environment as NAME=VALUE\0 records (values have no NUL: request.c checks). */
static int write_env_file(const char *path, const struct sbx_exec_request *req)
{
	size_t total = 0;
	for (uint32_t i = 0; i < req->env_count; i++)
		total += (size_t)req->env[i].name_len + req->env[i].value_len + 2;
	_cleanup_free_ uint8_t *buf = malloc(total ? total : 1);
	if (!buf)
		return -ENOMEM;
	size_t off = 0;
	for (uint32_t i = 0; i < req->env_count; i++) {
		const struct sbx_env_var *v = &req->env[i];
		memcpy(buf + off, v->name, v->name_len);
		off += v->name_len;
		buf[off++] = '=';
		if (v->value_len)
			memcpy(buf + off, v->value, v->value_len);
		off += v->value_len;
		buf[off++] = '\0';
	}
	return sbx_write_code_file(path, buf, off);
}

int sbx_repl_start(struct sbx_repl *r, uint32_t id, const struct sbx_exec_request *req,
		   uint32_t *code, char *msg, size_t msg_size)
{
	if (sbx_repl_busy(r)) {
		*code = SBX_ERR_BUSY;
		snprintf(msg, msg_size, "an execution is already running in this session");
		return -EBUSY;
	}
	if (r->pid > 0 && r->language != req->language) {
		*code = SBX_ERR_BAD_REQUEST;
		snprintf(msg, msg_size, "this session's REPL runs another language");
		return -EINVAL;
	}
	*code = SBX_ERR_INTERNAL;
	int rc = sbx_write_code_file(r->code_path, req->code, req->code_len);
	if (rc == 0)
		rc = write_env_file(r->env_path, req);
	if (rc < 0) {
		snprintf(msg, msg_size, "writing the request files: %s", strerror(-rc));
		return rc;
	}
	if (r->pid == 0 && (rc = spawn_driver(r, req->language, msg, msg_size)) < 0) {
		*code = SBX_ERR_SPAWN;
		return rc;
	}
	/* One line: the directory of the request files (well under PIPE_BUF: written whole). */
	char go[sizeof(r->cfg->run_dir) + 1];
	int len = snprintf(go, sizeof(go), "%s\n", r->cfg->run_dir);
	if (len < 0 || (size_t)len >= sizeof(go) || write(r->control_w, go, (size_t)len) != len) {
		/* The driver is dying (EPIPE) or wedged: reset it; the host may retry. */
		rc = -errno;
		snprintf(msg, msg_size, "the REPL did not take the request: %s", strerror(errno));
		kill_repl(r);
		return rc < 0 ? rc : -EIO;
	}
	r->phase = SBX_REPL_RUNNING;
	r->silent = false;
	r->interrupted = false;
	r->id = id;
	r->flags = 0;
	r->start_ns = sbx_now_ns();
	r->out.limit = req->stdout_limit;
	r->err.limit = req->stderr_limit;
	r->out.total = r->err.total = 0;
	arm(r, req->timeout_ms);
	return 0;
}

static void deliver(struct sbx_repl *r, struct sbx_stream *s, const uint8_t *data, size_t n)
{
	if (r->phase != SBX_REPL_RUNNING)
		return; /* output of background processes between requests: dropped */
	if (!sbx_stream_forward(s, r->ch, r->id, r->silent, data, n))
		return;
	r->flags |= s->limit_flag;
	if (!r->interrupted && r->pid > 0) {
		/* Interrupt the code, not the REPL: its state survives. */
		r->interrupted = true;
		kill(r->pid, SIGINT);
	}
}

/* One read; false once the pipe is at EOF or has nothing right now. */
static bool read_stream(struct sbx_repl *r, struct sbx_stream *s)
{
	static uint8_t buf[SBX_OUTPUT_CHUNK_MAX];
	long n = sbx_stream_read(s, buf, sizeof(buf));
	if (n > 0)
		deliver(r, s, buf, (size_t)n);
	return n > 0;
}

static void drain(struct sbx_repl *r)
{
	for (int i = 0; i < DRAIN_READS && read_stream(r, &r->out); i++)
		;
	for (int i = 0; i < DRAIN_READS && read_stream(r, &r->err); i++)
		;
}

static void finish(struct sbx_repl *r, int exit_code)
{
	arm(r, 0);
	struct sbx_exit e = {
		.exit_code = (r->flags & SBX_EXIT_TIMED_OUT) ? -1 : exit_code,
		.flags = r->flags,
		.duration_us = (sbx_now_ns() - r->start_ns) / 1000u,
	};
	if (!r->silent) {
		int rc = sbx_channel_send_exit(r->ch, r->id, &e);
		if (rc < 0 && rc != -ENOTCONN)
			sbx_log("sending EXIT: %s", strerror(-rc));
	}
	r->phase = SBX_REPL_IDLE;
	r->silent = false;
}

void sbx_repl_on_output(struct sbx_repl *r, struct sbx_stream *s)
{
	read_stream(r, s);
}

void sbx_repl_on_control(struct sbx_repl *r)
{
	char buf[64];
	ssize_t n = read(r->control_r, buf, sizeof(buf));
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		/* The driver closed its end: it is exiting; the reaper reports it. */
		sbx_close_fd(&r->control_r);
		return;
	}
	for (ssize_t i = 0; i < n; i++) {
		char c = buf[i];
		if (c != '\n') {
			if (r->line_len + 1 >= sizeof(r->line) || c < '0' || c > '9')
				goto bad;
			r->line[r->line_len++] = c;
			continue;
		}
		r->line[r->line_len] = '\0';
		long status = r->line_len ? strtol(r->line, NULL, 10) : -1;
		r->line_len = 0;
		if (status < 0 || status > 255)
			goto bad;
		if (r->phase != SBX_REPL_RUNNING)
			goto bad; /* a completion nobody asked for */
		/* Everything the code wrote is in the pipes before the driver reports. */
		drain(r);
		finish(r, (int)status);
	}
	return;
bad:
	/* Only user code writing to fd 4 gets here: treat the REPL as broken. */
	sbx_log("session REPL sent a malformed completion: resetting it");
	r->line_len = 0;
	kill_repl(r);
}

void sbx_repl_on_timer(struct sbx_repl *r)
{
	uint64_t ticks;
	if (read(r->timer_fd, &ticks, sizeof(ticks)) != (ssize_t)sizeof(ticks))
		return;
	if (r->phase == SBX_REPL_RUNNING) {
		r->flags |= SBX_EXIT_TIMED_OUT;
		r->phase = SBX_REPL_KILLING;
		kill_repl(r);
		arm(r, KILL_WAIT_MS);
	} else if (r->phase == SBX_REPL_KILLING) {
		/* Not reaped in time (cannot happen after SIGKILL by root): report anyway. */
		drain(r);
		finish(r, -1);
	}
}

void sbx_repl_on_child_exit(struct sbx_repl *r, pid_t pid, int status)
{
	if (pid != r->pid || r->pid == 0)
		return;
	/* The REPL is gone: whatever it started goes with it, and the next request starts afresh. */
	kill_repl(r);
	r->pid = 0;
	bool restart = false;
	if (r->phase != SBX_REPL_IDLE) {
		/* Died during a request the host still waits for: start the next REPL now, so that
		 * the interpreter's start-up overlaps the host's turn instead of the next request's
		 * timeout. Never for a death while idle: a driver that cannot start would loop. */
		restart = !r->silent;
		drain(r);
		int code = WIFEXITED(status)   ? WEXITSTATUS(status)
			   : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
						 : -1;
		finish(r, code);
	}
	close_fds(r);
	char msg[256];
	if (restart && spawn_driver(r, r->language, msg, sizeof(msg)) < 0)
		sbx_log("restarting the session REPL: %s", msg);
}

void sbx_repl_abort(struct sbx_repl *r)
{
	if (r->phase != SBX_REPL_IDLE)
		r->silent = true;
	if (r->pid > 0)
		kill_repl(r);
}
