/* Session REPL lifecycle: see repl.h. */
#include "repl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "host_socket.h"
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
	r->driver_dir = cfg->driver_dir[0] ? cfg->driver_dir : SBX_LIB_DIR;
	r->control_w = r->control_r = r->out.fd = r->err.fd = r->out_hold = r->err_hold = -1;
	r->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (r->timer_fd < 0)
		return -errno;
	snprintf(r->code_path, sizeof(r->code_path), "%s/session-code", cfg->run_dir);
	snprintf(r->env_path, sizeof(r->env_path), "%s/session-env", cfg->run_dir);
	/* The per-request output FIFOs live here: uid 1000 may open a FIFO whose name it was
	 * given, but cannot list the directory to find another request's. */
	snprintf(r->fifo_dir, sizeof(r->fifo_dir), "%s/repl", cfg->run_dir);
	if ((mkdir(r->fifo_dir, 0711) < 0 && errno != EEXIST) || chmod(r->fifo_dir, 0711) < 0)
		return -errno;
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
	r->line_len = 0;
}

/* The request's output is over: nobody can open its FIFOs any more, and whatever still holds
 * them (a background process of that request) gets EPIPE from now on instead of writing into a
 * later result. */
static void end_streams(struct sbx_repl *r)
{
	if (r->fifo_out[0]) {
		unlink(r->fifo_out);
		unlink(r->fifo_err);
		r->fifo_out[0] = r->fifo_err[0] = '\0';
	}
	sbx_close_fd(&r->out.fd);
	sbx_close_fd(&r->err.fd);
	sbx_close_fd(&r->out_hold);
	sbx_close_fd(&r->err_hold);
}

static int make_fifo(const struct sbx_repl *r, const char *path, int *read_fd, int *hold_fd,
		     struct stat *st)
{
	if (mkfifo(path, 0600) < 0)
		return -errno;
	if (r->cfg->drop_privileges && chown(path, SBX_USER_UID, SBX_USER_GID) < 0)
		return -errno;
	/* Non-blocking: opens without a writer, and reads never stall PID 1. The agent's own
	 * write end keeps the FIFO from reading as EOF while the driver swaps its fds (a FIFO read
	 * end is at EOF whenever no writer has it open): the request ends by its report, never by
	 * EOF, and the driver's open always finds the reader there. */
	*read_fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (*read_fd < 0 || fstat(*read_fd, st) < 0)
		return -errno;
	*hold_fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	return *hold_fd < 0 ? -errno : 0;
}

static void hex(char *out, const uint8_t *raw, size_t n)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

/* Fresh stdout/stderr FIFOs for one request, named by a random token, and the request's nonce,
 * which only its request line carries (the token is in the FIFOs' names, which the code can read
 * off its fds 1 and 2). */
static int begin_streams(struct sbx_repl *r, char *msg, size_t msg_size)
{
	uint8_t raw[(sizeof(r->token) - 1) / 2 + (sizeof(r->nonce) - 1) / 2];
	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
		snprintf(msg, msg_size, "getrandom: %s", strerror(errno));
		return -EIO;
	}
	hex(r->token, raw, (sizeof(r->token) - 1) / 2);
	hex(r->nonce, raw + (sizeof(r->token) - 1) / 2, (sizeof(r->nonce) - 1) / 2);
	snprintf(r->fifo_out, sizeof(r->fifo_out), "%s/%s.out", r->fifo_dir, r->token);
	snprintf(r->fifo_err, sizeof(r->fifo_err), "%s/%s.err", r->fifo_dir, r->token);
	int rc = make_fifo(r, r->fifo_out, &r->out.fd, &r->out_hold, &r->out_st);
	if (rc == 0)
		rc = make_fifo(r, r->fifo_err, &r->err.fd, &r->err_hold, &r->err_st);
	if (rc < 0) {
		snprintf(msg, msg_size, "output FIFOs: %s", strerror(-rc));
		end_streams(r);
		return rc;
	}
	r->out.msg_type = SBX_MSG_STDOUT;
	r->out.limit_flag = SBX_EXIT_STDOUT_LIMIT;
	r->err.msg_type = SBX_MSG_STDERR;
	r->err.limit_flag = SBX_EXIT_STDERR_LIMIT;
	return 0;
}

/* A write end for the driver's own stdout/stderr at spawn: the request's FIFO while a request
 * is starting (start-up errors belong to it), /dev/null otherwise. Blocking, like a pipe. */
static int spawn_output_fd(const char *fifo)
{
	if (!fifo || !fifo[0])
		return open("/dev/null", O_WRONLY | O_CLOEXEC);
	int fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd >= 0)
		fcntl(fd, F_SETFL, 0);
	return fd;
}

bool sbx_repl_driver_path(const struct sbx_repl *r, uint8_t language, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s/%s", r->driver_dir, driver_names[language]);
	return n >= 0 && (size_t)n < size;
}

static void take_driver(struct sbx_repl *r, uint8_t language, pid_t pid, int control_w,
			int control_r, bool socket)
{
	r->control_is_socket = socket;
	/* The agent's ends never block: a REPL that stops reading must not stall PID 1. */
	fcntl(control_w, F_SETFL, O_NONBLOCK);
	fcntl(control_r, F_SETFL, O_NONBLOCK);
	r->pid = pid;
	r->language = language;
	r->control_w = control_w;
	r->control_r = control_r;
	r->line_len = 0;
}

void sbx_repl_adopt(struct sbx_repl *r, uint8_t language, pid_t pid, int control_fd)
{
	/* Two fds on the one socket: each of control_w and control_r is closed on its own. */
	int second = fcntl(control_fd, F_DUPFD_CLOEXEC, 0);
	if (second < 0) {
		sbx_log("adopting the REPL: dup: %s", strerror(errno));
		if (kill(-pid, SIGKILL) < 0 && errno != ESRCH)
			sbx_log("kill(-%d): %s", (int)pid, strerror(errno));
		close(control_fd);
		return; /* the request spawns a driver instead */
	}
	take_driver(r, language, pid, control_fd, second, true);
}

/* Start the driver for `language`. Its base environment is the clean one of one-shot code; each
 * request's variables are applied by the driver. Its stdout/stderr are the current request's
 * FIFOs when one is starting, /dev/null otherwise: the driver installs each request's FIFOs
 * itself (see repl.h). */
static int spawn_driver(struct sbx_repl *r, uint8_t language, bool for_request, char *msg,
			size_t msg_size)
{
	char script[300];
	if (!sbx_repl_driver_path(r, language, script, sizeof(script))) {
		snprintf(msg, msg_size, "driver path too long");
		return -ENAMETOOLONG;
	}
	char **envp = NULL;
	int rc = sbx_env_build(r->cfg, NULL, &envp);
	if (rc < 0) {
		snprintf(msg, msg_size, "building environment: %s", strerror(-rc));
		return rc;
	}
	int out = -1, err = -1, cin[2] = {-1, -1}, cout[2] = {-1, -1};
	out = spawn_output_fd(for_request ? r->fifo_out : NULL);
	err = spawn_output_fd(for_request ? r->fifo_err : NULL);
	if (out < 0 || err < 0 || pipe2(cin, O_CLOEXEC) < 0 || pipe2(cout, O_CLOEXEC) < 0) {
		rc = -errno;
		snprintf(msg, msg_size, "driver fds: %s", strerror(-rc));
		goto out;
	}
	struct sbx_spawn sp = sbx_user_spawn(r->cfg, language, script, envp, out, err);
	sp.with_control = true;
	sp.control_in_fd = cin[0];
	sp.control_out_fd = cout[1];
	pid_t pid;
	rc = sbx_spawn(&sp, &pid, msg, msg_size);
	if (rc < 0)
		goto out;
	sbx_close_fd(&cin[0]);
	sbx_close_fd(&cout[1]);
	take_driver(r, language, pid, cin[1], cout[0], false);
	cin[1] = cout[0] = -1;
out:
	sbx_env_free(envp);
	sbx_close_fd(&out);
	sbx_close_fd(&err);
	int *fds[] = {cin, cout};
	for (size_t i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			sbx_close_fd(&fds[i][j]);
	return rc;
}

/* Kill the REPL and everything the user started; the pid is reaped by the event loop later. */
static void kill_repl(struct sbx_repl *r)
{
	if (r->pid > 0 && kill(-r->pid, SIGKILL) < 0 && errno != ESRCH)
		sbx_log("kill(-%d): %s", (int)r->pid, strerror(errno));
	sbx_kill_user_processes(r->cfg);
}

/* The request's environment as NAME=VALUE\0 records (values have no NUL: agent_request_guest.c
 * checks). */
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
	if ((rc = begin_streams(r, msg, msg_size)) < 0)
		return rc;
	if (r->pid == 0 && (rc = spawn_driver(r, req->language, true, msg, msg_size)) < 0) {
		*code = SBX_ERR_SPAWN;
		end_streams(r);
		return rc;
	}
	/* One line, well under PIPE_BUF (written whole): "<seq> <token> <nonce> <directory>", the
	 * directory holding the request files and, under repl/, the FIFOs <token>.out/.err. */
	r->seq++;
	char go[sizeof(r->cfg->run_dir) + 96];
	int len = snprintf(go, sizeof(go), "%u %s %s %s\n", r->seq, r->token, r->nonce,
			   r->cfg->run_dir);
	if (len < 0 || (size_t)len >= sizeof(go) || write(r->control_w, go, (size_t)len) != len) {
		/* The driver is dying (EPIPE) or wedged: reset it; the host may retry. */
		rc = -errno;
		snprintf(msg, msg_size, "the REPL did not take the request: %s", strerror(errno));
		kill_repl(r);
		end_streams(r);
		return rc < 0 ? rc : -EIO;
	}
	r->phase = SBX_REPL_RUNNING;
	r->silent = false;
	r->interrupted = false;
	r->ignored_logged = false;
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
	sbx_exec_ended(r->id);
	r->phase = SBX_REPL_IDLE;
	r->silent = false;
	end_streams(r);
}

void sbx_repl_on_output(struct sbx_repl *r, struct sbx_stream *s)
{
	read_stream(r, s);
}

static void close_dir(DIR **d)
{
	if (*d)
		closedir(*d);
}
#define _cleanup_closedir_ __attribute__((cleanup(close_dir)))

/* Whether any task of process `pid` has an fd open on the request's FIFOs. Threads made without
 * CLONE_FILES have their own fd tables: every task's is looked at. */
static bool holds_fifos(const struct sbx_repl *r)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)r->pid);
	_cleanup_closedir_ DIR *tasks = opendir(path);
	if (!tasks)
		return false; /* gone: the reaper reports it */
	struct dirent *t;
	while ((t = readdir(tasks))) {
		if (t->d_name[0] < '0' || t->d_name[0] > '9')
			continue;
		char fds_path[sizeof(path) + sizeof(t->d_name) + 4];
		snprintf(fds_path, sizeof(fds_path), "%s/%s/fd", path, t->d_name);
		_cleanup_closedir_ DIR *fds = opendir(fds_path);
		if (!fds)
			continue;
		struct dirent *f;
		while ((f = readdir(fds))) {
			struct stat st;
			if (f->d_name[0] == '.' || fstatat(dirfd(fds), f->d_name, &st, 0) < 0)
				continue;
			if ((st.st_dev == r->out_st.st_dev && st.st_ino == r->out_st.st_ino) ||
			    (st.st_dev == r->err_st.st_dev && st.st_ino == r->err_st.st_ino))
				return true;
		}
	}
	return false;
}

/* A completion line is believed only when what user code cannot fake from inside the REPL
 * holds: the driver took this request's line off fd 3, and no fd of the REPL process refers to
 * this request's FIFOs any more (the driver points every one of them at /dev/null before it
 * reports). User code that writes a status line while it keeps a way to print (its stdout, or a
 * saved copy of it) has its line ignored, and its request goes on; code that gives up every copy
 * first has ended its own output: whatever it writes later reaches no result. */
static bool completion_believable(const struct sbx_repl *r)
{
	/* What the driver has not read of the agent's writes: FIONREAD on a pipe's write end; on the
	 * socket of an adopted driver FIONREAD would count the agent's own receive queue, SIOCOUTQ
	 * counts what the peer has not read yet. */
	int queued = 0;
	if (ioctl(r->control_w, r->control_is_socket ? SIOCOUTQ : FIONREAD, &queued) < 0 ||
	    queued > 0)
		return false;
	return !holds_fifos(r);
}

/* Whether `line` is "<seq> <nonce> <status>" with status 0..255 and the current request's
 * nonce; fills seq and status. */
static bool parse_completion(const struct sbx_repl *r, const char *line, unsigned long *seq,
			     long *status)
{
	char *end;
	const size_t nonce_len = sizeof(r->nonce) - 1;
	if (line[0] < '0' || line[0] > '9')
		return false;
	*seq = strtoul(line, &end, 10);
	if (*end != ' ' || strncmp(end + 1, r->nonce, nonce_len) != 0)
		return false;
	end += 1 + nonce_len;
	if (*end != ' ' || end[1] < '0' || end[1] > '9')
		return false;
	*status = strtol(end + 1, &end, 10);
	return *end == '\0' && *status >= 0 && *status <= 255;
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
			/* An overlong line is dropped up to its newline (line_len past the buffer). */
			if (r->line_len + 1 < sizeof(r->line))
				r->line[r->line_len] = c;
			if (r->line_len < sizeof(r->line))
				r->line_len++;
			continue;
		}
		bool whole = r->line_len + 1 < sizeof(r->line);
		r->line[whole ? r->line_len : 0] = '\0';
		bool empty = r->line_len == 0;
		r->line_len = 0;
		unsigned long seq;
		long status;
		/* The drivers write "\n<seq> <nonce> <status>\n": the leading newline ends whatever
		 * user code left unfinished on the fd, so the report itself always parses. Anything
		 * else, and any line that is not believable, only user code can have written: ignored,
		 * so that nothing written there ends a request or resets the REPL. */
		if (empty)
			continue;
		if (!whole || !parse_completion(r, r->line, &seq, &status) ||
		    r->phase != SBX_REPL_RUNNING || seq != r->seq || !completion_believable(r)) {
			if (!r->ignored_logged)
				sbx_log("session REPL: a completion line that the driver did not write "
					"(malformed, for another request, or while the code runs) is "
					"ignored");
			r->ignored_logged = true;
			continue;
		}
		/* Everything the code wrote is in the FIFOs before the driver reports. */
		drain(r);
		finish(r, (int)status);
	}
}

void sbx_repl_on_timer(struct sbx_repl *r)
{
	uint64_t ticks;
	if (read(r->timer_fd, &ticks, sizeof(ticks)) != (ssize_t)sizeof(ticks))
		return;
	if (r->phase == SBX_REPL_RUNNING) {
		r->flags |= SBX_EXIT_TIMED_OUT | SBX_EXIT_REPL_RESET;
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
		r->flags |= SBX_EXIT_REPL_RESET;
		drain(r);
		int code = WIFEXITED(status)   ? WEXITSTATUS(status)
			   : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
						 : -1;
		finish(r, code);
	}
	close_fds(r);
	char msg[256];
	if (restart && spawn_driver(r, r->language, false, msg, sizeof(msg)) < 0)
		sbx_log("restarting the session REPL: %s", msg);
}

void sbx_repl_abort(struct sbx_repl *r)
{
	if (r->phase != SBX_REPL_IDLE)
		r->silent = true;
	if (r->pid > 0)
		kill_repl(r);
}
