/* Background processes and terminals: see procs.h. */
#include "procs.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent_request_guest.h"
#include "cleanup.h"
#include "spawn.h"

/* The one table of the agent: the sweep of uid 1000 (runner.c) asks it whom to spare. */
static struct sbx_procs *the_table;

/* PROC_INFO entry: u32 pid, u8 flags, i32 exit, u64 out, u64 err, str command. */
#define INFO_ENTRY_MAX (4u + 1u + 4u + 8u + 8u + 4u + SBX_PROC_COMMAND_MAX)
_Static_assert(4u + SBX_PROC_TRACKED_MAX * INFO_ENTRY_MAX <= SBX_GUEST_FRAME_MAX,
	       "a PROC_LIST reply fits one guest frame");
_Static_assert(SBX_PROCS_POLL_MAX <= 65535u, "map slots are u16");

void sbx_procs_init(struct sbx_procs *t, const struct sbx_config *cfg, struct sbx_channel *ch)
{
	memset(t, 0, sizeof(*t));
	t->cfg = cfg;
	t->ch = ch;
	/* Growth past each ring's first SBX_RING_MIN_CAP bytes: with those, every ring of every
	 * record together stays within SBX_PROC_BUFFERS_TOTAL_MAX. */
	t->budget.max = SBX_PROC_BUFFERS_TOTAL_MAX - 2u * SBX_PROC_TRACKED_MAX * SBX_RING_MIN_CAP;
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++) {
		struct sbx_proc *p = &t->proc[i];
		p->in_fd = p->out_fd = p->err_fd = p->master_fd = -1;
	}
	/* Up to three fds per tracked record, beside the agent's own: more than the usual soft
	 * limit of 1024 allows. User code gets its own limit (spawn.c). */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
		rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= 4096 ? 4096 : rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	the_table = t;
}

static struct sbx_proc *find(struct sbx_procs *t, pid_t pid)
{
	if (pid <= 0)
		return NULL;
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++)
		if (t->proc[i].pid == pid)
			return &t->proc[i];
	return NULL;
}

static size_t count_running(const struct sbx_procs *t)
{
	size_t n = 0;
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++)
		n += t->proc[i].pid > 0 && t->proc[i].running;
	return n;
}

/* --- replies --------------------------------------------------------------------------------- */

static uint8_t proc_flags(const struct sbx_proc *p)
{
	return (uint8_t)((p->running ? SBX_PROC_RUNNING : 0) | (p->pty ? SBX_PROC_PTY : 0) |
			 (p->in_fd >= 0 ? SBX_PROC_STDIN_OPEN : 0));
}

static int put_info(struct sbx_buf *b, const struct sbx_proc *p)
{
	int rc = sbx_put_u32(b, (uint32_t)p->pid);
	if (rc == 0)
		rc = sbx_put_u8(b, proc_flags(p));
	if (rc == 0)
		rc = sbx_put_u32(b, p->running ? 0u : (uint32_t)p->exit_code);
	if (rc == 0)
		rc = sbx_put_u64(b, p->out.end);
	if (rc == 0)
		rc = sbx_put_u64(b, p->err.end);
	if (rc == 0)
		rc = sbx_put_str(b, p->command, p->command_len);
	return rc;
}

/* PROC_INFO with the given records. */
static void send_info(struct sbx_procs *t, uint32_t id, struct sbx_proc *const *list, size_t n)
{
	struct sbx_buf b = {0};
	int rc = sbx_put_u32(&b, (uint32_t)n);
	for (size_t i = 0; rc == 0 && i < n; i++)
		rc = put_info(&b, list[i]);
	if (rc == 0)
		rc = sbx_channel_send(t->ch, SBX_MSG_PROC_INFO, id, b.data, b.len);
	if (rc < 0 && rc != -ENOTCONN) {
		sbx_log("PROC_INFO %u: %s", id, strerror(-rc));
		sbx_channel_send_error(t->ch, id, SBX_ERR_INTERNAL, "PROC_INFO: %s", strerror(-rc));
	}
	sbx_buf_free(&b);
}

static void send_one_info(struct sbx_procs *t, uint32_t id, struct sbx_proc *p)
{
	send_info(t, id, &p, 1);
}

static struct sbx_ring *ring_of(struct sbx_proc *p, uint8_t stream)
{
	return stream == SBX_PROC_STDOUT ? &p->out : &p->err;
}

static bool eof_of(const struct sbx_proc *p, uint8_t stream)
{
	return stream == SBX_PROC_STDOUT ? p->out_eof : p->err_eof;
}

/* PROC_DATA for a read at `offset`: what the ring has (maybe nothing), EOF when the stream has
 * ended and these bytes are its last. */
static void send_data(struct sbx_procs *t, uint32_t id, struct sbx_proc *p, uint8_t stream,
		      uint64_t offset, uint32_t max)
{
	static uint8_t payload[8 + 1 + SBX_OUTPUT_CHUNK_MAX];
	const struct sbx_ring *r = ring_of(p, stream);
	uint64_t from = offset;
	long n = sbx_ring_read(r, offset, payload + 9, max, &from);
	if (n < 0)
		n = 0; /* checked by the caller: offset <= end */
	bool eof = eof_of(p, stream) && from + (uint64_t)n == r->end;
	for (int i = 0; i < 8; i++)
		payload[i] = (uint8_t)(from >> (8 * i));
	payload[8] = eof ? SBX_PROC_DATA_EOF : 0;
	sbx_channel_send(t->ch, SBX_MSG_PROC_DATA, id, payload, 9 + (size_t)n);
}

static void no_process(struct sbx_procs *t, uint32_t id, uint32_t pid, const char *what)
{
	sbx_channel_send_error(t->ch, id, SBX_ERR_NO_PROCESS, "process %u: %s", pid, what);
}

/* --- held replies ---------------------------------------------------------------------------- */

/* A free place for request id's held reply, its id set; NULL (and the request answered with
 * ERROR LIMIT) when SBX_PROC_PENDING_MAX are held already. */
static struct sbx_held *hold(struct sbx_procs *t, uint32_t id)
{
	for (size_t i = 0; i < SBX_PROC_PENDING_MAX; i++)
		if (t->held[i].kind == SBX_HELD_NONE) {
			memset(&t->held[i], 0, sizeof(t->held[i]));
			t->held[i].seq = ++t->seq;
			t->held[i].id = id;
			return &t->held[i];
		}
	sbx_channel_send_error(t->ch, id, SBX_ERR_LIMIT, "%u replies are held already",
			       SBX_PROC_PENDING_MAX);
	return NULL;
}

static void release(struct sbx_held *h)
{
	free(h->data);
	memset(h, 0, sizeof(*h));
}

static void close_stdin(struct sbx_proc *p)
{
	if (p->in_fd < 0)
		return;
	if (p->pty) {
		/* The master is also the output: a terminal's "end of input" is its EOF character
		 * (at the start of a line, as a person's Ctrl-D). */
		struct termios tio;
		char eof = tcgetattr(p->in_fd, &tio) == 0 ? (char)tio.c_cc[VEOF] : '\x04';
		ssize_t w = write(p->in_fd, &eof, 1);
		(void)w;
		p->in_fd = -1; /* borrowed */
		return;
	}
	sbx_close_fd(&p->in_fd);
}

/* The oldest held write of p, if any: only it may write now. */
static struct sbx_held *first_write(struct sbx_procs *t, pid_t pid)
{
	struct sbx_held *first = NULL;
	for (size_t i = 0; i < SBX_PROC_PENDING_MAX; i++) {
		struct sbx_held *h = &t->held[i];
		if (h->kind == SBX_HELD_WRITE && h->pid == pid && (!first || h->seq < first->seq))
			first = h;
	}
	return first;
}

/* Write what the pipe takes now. 1: all written (and stdin closed if asked), 0: more to go,
 * <0: stdin is gone (-EPIPE, -EIO) or closed. */
static int pump_write(struct sbx_proc *p, struct sbx_held *h)
{
	if (p->in_fd < 0)
		return -EPIPE;
	while (h->done < h->len) {
		ssize_t w = write(p->in_fd, h->data + h->done, h->len - h->done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			return 0;
		if (w < 0) {
			int e = errno;
			/* A reader that is gone never comes back. */
			if (!p->pty)
				sbx_close_fd(&p->in_fd);
			return -e;
		}
		h->done += (uint32_t)w;
	}
	if (h->close_stdin)
		close_stdin(p);
	return 1;
}

/* Answer h if its condition holds or its deadline passed; true when it is answered. */
static bool try_answer(struct sbx_procs *t, struct sbx_held *h, uint64_t now)
{
	struct sbx_proc *p = find(t, h->pid);
	bool late = now >= h->deadline_ns;
	switch (h->kind) {
	case SBX_HELD_READ: {
		if (!p) {
			no_process(t, h->id, (uint32_t)h->pid, "no longer tracked");
			return true;
		}
		const struct sbx_ring *r = ring_of(p, h->stream);
		if (r->end > h->offset || eof_of(p, h->stream) || late) {
			send_data(t, h->id, p, h->stream, h->offset, h->max);
			return true;
		}
		return false;
	}
	case SBX_HELD_WAIT:
		if (!p) {
			no_process(t, h->id, (uint32_t)h->pid, "no longer tracked");
			return true;
		}
		if (!p->running || late) {
			send_one_info(t, h->id, p);
			return true;
		}
		return false;
	case SBX_HELD_WRITE: {
		if (!p || !p->running) {
			no_process(t, h->id, (uint32_t)h->pid, "ended before its input was written");
			return true;
		}
		if (first_write(t, h->pid) != h)
			return false;
		int rc = pump_write(p, h);
		if (rc == 0)
			return false;
		if (rc < 0)
			no_process(t, h->id, (uint32_t)h->pid, "its stdin is closed");
		else
			sbx_channel_send(t->ch, SBX_MSG_PONG, h->id, NULL, 0);
		return true;
	}
	default:
		return false;
	}
}

static void answer_ready(struct sbx_procs *t)
{
	uint64_t now = sbx_now_ns();
	/* In arrival order: a process's writes must go in theirs. */
	for (;;) {
		bool any = false;
		for (size_t i = 0; i < SBX_PROC_PENDING_MAX; i++) {
			struct sbx_held *h = &t->held[i];
			if (h->kind == SBX_HELD_NONE)
				continue;
			if (try_answer(t, h, now)) {
				release(h);
				any = true;
			}
		}
		/* An answered write may let the same process's next one go at once. */
		if (!any)
			break;
	}
}

void sbx_procs_drop_held(struct sbx_procs *t)
{
	for (size_t i = 0; i < SBX_PROC_PENDING_MAX; i++)
		if (t->held[i].kind != SBX_HELD_NONE)
			release(&t->held[i]);
}

/* --- the table ------------------------------------------------------------------------------- */

/* Close a record's fds: a terminal's in_fd and out_fd borrow its master. */
static void close_fds(struct sbx_proc *p)
{
	if (p->pty)
		p->in_fd = p->out_fd = -1;
	sbx_close_fd(&p->in_fd);
	sbx_close_fd(&p->out_fd);
	sbx_close_fd(&p->err_fd);
	sbx_close_fd(&p->master_fd);
}

static void free_record(struct sbx_procs *t, struct sbx_proc *p)
{
	close_fds(p);
	sbx_ring_free(&p->out, &t->budget);
	sbx_ring_free(&p->err, &t->budget);
	memset(p, 0, sizeof(*p));
	p->in_fd = p->out_fd = p->err_fd = p->master_fd = -1;
}

/* An ended record goes: the replies held for it get their answer first, so that none of them
 * is taken for the next process of that pid. */
static void evict(struct sbx_procs *t, struct sbx_proc *p)
{
	for (size_t i = 0; i < SBX_PROC_PENDING_MAX; i++) {
		struct sbx_held *h = &t->held[i];
		if (h->kind != SBX_HELD_NONE && h->pid == p->pid) {
			no_process(t, h->id, (uint32_t)h->pid, "no longer tracked");
			release(h);
		}
	}
	free_record(t, p);
}

/* A slot for a new process with `pid`: an ended record of the same pid goes (the kernel reused
 * it), else a free slot, else the record that ended first. */
static struct sbx_proc *slot_for(struct sbx_procs *t, pid_t pid)
{
	struct sbx_proc *same = find(t, pid), *free_slot = NULL, *oldest = NULL;
	if (same) {
		evict(t, same);
		return same;
	}
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++) {
		struct sbx_proc *p = &t->proc[i];
		if (p->pid == 0) {
			free_slot = p;
			break;
		}
		if (!p->running && (!oldest || p->ended < oldest->ended))
			oldest = p;
	}
	if (free_slot)
		return free_slot;
	if (oldest)
		evict(t, oldest);
	return oldest; /* never NULL: at most SBX_PROC_MAX < SBX_PROC_TRACKED_MAX run */
}

static void set_command(struct sbx_proc *p, const struct sbx_proc_spawn_request *req)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < req->argc && n < sizeof(p->command); i++) {
		if (i > 0)
			p->command[n++] = ' ';
		uint32_t take = req->argv[i].n;
		if (take > sizeof(p->command) - n)
			take = (uint32_t)(sizeof(p->command) - n);
		memcpy(p->command + n, req->argv[i].p, take);
		n += take;
	}
	p->command_len = n;
}

static char *dup_bytes(const struct sbx_bytes *b)
{
	char *s = malloc((size_t)b->n + 1);
	if (s) {
		memcpy(s, b->p, b->n);
		s[b->n] = '\0';
	}
	return s;
}

static void free_argv(char **argv)
{
	if (!argv)
		return;
	for (char **a = argv; *a; a++)
		free(*a);
	free(argv);
}

/* A new pseudo-terminal of the given size: the master (non-blocking) and its slave, owned by the
 * sandbox user when the agent drops privileges (so that `tty` and reopening /dev/tty work). */
static int open_pty(const struct sbx_config *cfg, uint16_t cols, uint16_t rows, int *master_out,
		    int *slave_out)
{
	_cleanup_close_ int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (master < 0)
		return -errno;
	if (grantpt(master) < 0 || unlockpt(master) < 0)
		return -errno;
	int slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (slave < 0) {
		/* Kernels before 4.13: by name. */
		char name[64];
		if (ptsname_r(master, name, sizeof(name)) != 0)
			return -errno;
		slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (slave < 0)
			return -errno;
	}
	struct winsize ws = {.ws_row = rows, .ws_col = cols};
	if (ioctl(master, TIOCSWINSZ, &ws) < 0 ||
	    (cfg->drop_privileges && fchown(slave, SBX_USER_UID, (gid_t)-1) < 0) ||
	    fcntl(master, F_SETFL, O_NONBLOCK) < 0) {
		int e = errno;
		close(slave);
		return -e;
	}
	*master_out = TAKE_FD(master);
	*slave_out = slave;
	return 0;
}

/* Start the process; 0 with *pid, or a negative errno with *code and msg for the ERROR. The
 * record's fds are filled in p (not yet in the table). */
static int start(struct sbx_procs *t, const struct sbx_proc_spawn_request *req,
		 struct sbx_proc *p, uint32_t *code, char *msg, size_t msg_size)
{
	*code = SBX_ERR_INTERNAL;
	/* The environment as an EXEC with these variables gets it. */
	_cleanup_free_ struct sbx_exec_request *envreq = calloc(1, sizeof(*envreq));
	char **argv = calloc((size_t)req->argc + 1, sizeof(char *));
	_cleanup_free_ char *cwd = req->cwd.n ? dup_bytes(&req->cwd) : NULL;
	char **envp = NULL;
	int child_in = -1, child_out = -1, child_err = -1;
	int rc = -ENOMEM;
	if (!envreq || !argv || (req->cwd.n && !cwd))
		goto oom;
	for (uint32_t i = 0; i < req->argc; i++)
		if (!(argv[i] = dup_bytes(&req->argv[i])))
			goto oom;
	envreq->env_count = req->env_count;
	memcpy(envreq->env, req->env, sizeof(req->env[0]) * req->env_count);
	if ((rc = sbx_env_build(t->cfg, envreq, &envp)) < 0)
		goto oom;

	if (req->flags & SBX_SPAWN_PTY) {
		rc = open_pty(t->cfg, req->cols, req->rows, &p->master_fd, &child_in);
		if (rc < 0) {
			snprintf(msg, msg_size, "pseudo-terminal: %s", strerror(-rc));
			goto out;
		}
		p->in_fd = p->out_fd = p->master_fd;
		p->pty = true;
		child_out = child_err = child_in;
	} else {
		int in[2], out[2], err[2];
		if (pipe2(in, O_CLOEXEC) < 0) {
			rc = -errno;
			snprintf(msg, msg_size, "pipe: %s", strerror(-rc));
			goto out;
		}
		p->in_fd = in[1];
		child_in = in[0];
		fcntl(p->in_fd, F_SETFL, O_NONBLOCK);
		if ((rc = sbx_output_pipes(out, err)) < 0) {
			snprintf(msg, msg_size, "pipe: %s", strerror(-rc));
			goto out;
		}
		p->out_fd = out[0];
		p->err_fd = err[0];
		child_out = out[1];
		child_err = err[1];
	}
	struct sbx_spawn sp = sbx_user_spawn(t->cfg, SBX_LANG_RAW, NULL, envp, child_out, child_err);
	sp.argv = argv;
	sp.with_stdin = true;
	sp.stdin_fd = child_in;
	sp.ctty = p->pty;
	if (cwd) {
		sp.home = cwd;
		sp.home_fallback = NULL;
	}
	pid_t pid;
	rc = sbx_spawn(&sp, &pid, msg, msg_size);
	if (rc < 0) {
		*code = SBX_ERR_SPAWN;
		goto out;
	}
	p->pid = pid;
	rc = 0;
	goto out;
oom:
	snprintf(msg, msg_size, "out of memory");
out:
	if (child_out != child_in)
		sbx_close_fd(&child_out);
	if (child_err != child_in)
		sbx_close_fd(&child_err);
	sbx_close_fd(&child_in);
	sbx_env_free(envp);
	free_argv(argv);
	return rc;
}

static void handle_spawn(struct sbx_procs *t, const struct sbx_frame *f)
{
	_cleanup_free_ struct sbx_proc_spawn_request *req = malloc(sizeof(*req));
	const char *why = NULL;
	if (!req) {
		sbx_channel_send_error(t->ch, f->id, SBX_ERR_INTERNAL, "PROC_SPAWN: out of memory");
		return;
	}
	if (sbx_parse_proc_spawn(f->payload, f->payload_len, req, &why) < 0) {
		sbx_channel_send_error(t->ch, f->id, SBX_ERR_BAD_REQUEST, "bad PROC_SPAWN: %s", why);
		return;
	}
	if (count_running(t) >= SBX_PROC_MAX) {
		sbx_channel_send_error(t->ch, f->id, SBX_ERR_LIMIT,
				       "%u processes are running already", SBX_PROC_MAX);
		return;
	}
	struct sbx_proc np = {.in_fd = -1, .out_fd = -1, .err_fd = -1, .master_fd = -1};
	uint32_t code = 0;
	char msg[512];
	int rc = start(t, req, &np, &code, msg, sizeof(msg));
	if (rc < 0) {
		close_fds(&np);
		sbx_channel_send_error(t->ch, f->id, code, "%s", msg);
		return;
	}
	struct sbx_proc *p = slot_for(t, np.pid);
	np.running = true;
	np.seq = ++t->seq;
	sbx_ring_init(&np.out, SBX_PROC_BUFFER_MAX);
	sbx_ring_init(&np.err, SBX_PROC_BUFFER_MAX);
	set_command(&np, req);
	*p = np;
	send_one_info(t, f->id, p);
}

static void handle_read(struct sbx_procs *t, const struct sbx_proc_request *r, uint32_t id)
{
	struct sbx_proc *p = find(t, (pid_t)r->pid);
	if (!p) {
		no_process(t, id, r->pid, "not tracked");
		return;
	}
	const struct sbx_ring *ring = ring_of(p, r->stream);
	if (r->offset > ring->end) {
		sbx_channel_send_error(t->ch, id, SBX_ERR_BAD_REQUEST,
				       "PROC_READ offset %llu past the %llu bytes produced",
				       (unsigned long long)r->offset, (unsigned long long)ring->end);
		return;
	}
	if (ring->end > r->offset || eof_of(p, r->stream) || r->wait_ms == 0) {
		send_data(t, id, p, r->stream, r->offset, r->max);
		return;
	}
	struct sbx_held *h = hold(t, id);
	if (!h)
		return;
	h->kind = SBX_HELD_READ;
	h->pid = p->pid;
	h->stream = r->stream;
	h->offset = r->offset;
	h->max = r->max;
	h->deadline_ns = sbx_now_ns() + (uint64_t)r->wait_ms * 1000000u;
}

static void handle_wait(struct sbx_procs *t, const struct sbx_proc_request *r, uint32_t id)
{
	struct sbx_proc *p = find(t, (pid_t)r->pid);
	if (!p) {
		no_process(t, id, r->pid, "not tracked");
		return;
	}
	if (!p->running || r->wait_ms == 0) {
		send_one_info(t, id, p);
		return;
	}
	struct sbx_held *h = hold(t, id);
	if (!h)
		return;
	h->kind = SBX_HELD_WAIT;
	h->pid = p->pid;
	h->deadline_ns = sbx_now_ns() + (uint64_t)r->wait_ms * 1000000u;
}

static void handle_write(struct sbx_procs *t, const struct sbx_proc_request *r, uint32_t id)
{
	struct sbx_proc *p = find(t, (pid_t)r->pid);
	if (!p || !p->running || p->in_fd < 0) {
		no_process(t, id, r->pid,
			   !p ? "not tracked" : !p->running ? "has ended" : "its stdin is closed");
		return;
	}
	struct sbx_held *h = hold(t, id);
	if (!h)
		return;
	h->kind = SBX_HELD_WRITE;
	h->pid = p->pid;
	h->deadline_ns = UINT64_MAX; /* a write waits for the reader, however long */
	h->close_stdin = r->flags & SBX_PROC_CLOSE_STDIN;
	h->len = r->data.n;
	if (h->len && !(h->data = malloc(h->len))) {
		release(h);
		sbx_channel_send_error(t->ch, id, SBX_ERR_INTERNAL, "PROC_WRITE: out of memory");
		return;
	}
	if (h->len)
		memcpy(h->data, r->data.p, h->len);
	/* Most writes fit the pipe: answered before this returns. */
	if (try_answer(t, h, sbx_now_ns()))
		release(h);
}

static void handle_signal(struct sbx_procs *t, const struct sbx_proc_request *r, uint32_t id)
{
	struct sbx_proc *p = find(t, (pid_t)r->pid);
	if (!p || !p->running) {
		no_process(t, id, r->pid, !p ? "not tracked" : "has ended");
		return;
	}
	/* Its group: the leader is unreaped, so the group id is still its own. */
	if (kill(-p->pid, (int)r->signal) < 0 && errno != ESRCH) {
		sbx_channel_send_error(t->ch, id, SBX_ERR_BAD_REQUEST, "signal %u: %s", r->signal,
				       strerror(errno));
		return;
	}
	sbx_channel_send(t->ch, SBX_MSG_PONG, id, NULL, 0);
}

static void handle_resize(struct sbx_procs *t, const struct sbx_proc_request *r, uint32_t id)
{
	struct sbx_proc *p = find(t, (pid_t)r->pid);
	if (!p || !p->running || !p->pty || p->master_fd < 0) {
		no_process(t, id, r->pid,
			   !p ? "not tracked" : !p->running ? "has ended" : "has no terminal");
		return;
	}
	/* The kernel sends SIGWINCH to the terminal's foreground group. */
	struct winsize ws = {.ws_row = r->rows, .ws_col = r->cols};
	if (ioctl(p->master_fd, TIOCSWINSZ, &ws) < 0) {
		sbx_channel_send_error(t->ch, id, SBX_ERR_INTERNAL, "TIOCSWINSZ: %s",
				       strerror(errno));
		return;
	}
	sbx_channel_send(t->ch, SBX_MSG_PONG, id, NULL, 0);
}

static int by_seq(const void *a, const void *b)
{
	const struct sbx_proc *x = *(struct sbx_proc *const *)a, *y = *(struct sbx_proc *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void handle_list(struct sbx_procs *t, uint32_t id)
{
	static struct sbx_proc *list[SBX_PROC_TRACKED_MAX];
	size_t n = 0;
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++)
		if (t->proc[i].pid > 0)
			list[n++] = &t->proc[i];
	qsort(list, n, sizeof(list[0]), by_seq);
	send_info(t, id, list, n);
}

void sbx_procs_handle(struct sbx_procs *t, const struct sbx_frame *f)
{
	if (f->type == SBX_MSG_PROC_SPAWN) {
		handle_spawn(t, f);
		return;
	}
	struct sbx_proc_request r;
	const char *why = NULL;
	if (sbx_parse_proc_request(f->type, f->payload, f->payload_len, &r, &why) < 0) {
		sbx_channel_send_error(t->ch, f->id, SBX_ERR_BAD_REQUEST, "bad PROC request: %s",
				       why);
		return;
	}
	switch (f->type) {
	case SBX_MSG_PROC_READ:
		handle_read(t, &r, f->id);
		break;
	case SBX_MSG_PROC_WRITE:
		handle_write(t, &r, f->id);
		break;
	case SBX_MSG_PROC_SIGNAL:
		handle_signal(t, &r, f->id);
		break;
	case SBX_MSG_PROC_WAIT:
		handle_wait(t, &r, f->id);
		break;
	case SBX_MSG_PROC_LIST:
		handle_list(t, f->id);
		break;
	case SBX_MSG_PROC_RESIZE:
		handle_resize(t, &r, f->id);
		break;
	default:
		break;
	}
}

/* --- the event loop -------------------------------------------------------------------------- */

int sbx_procs_poll(struct sbx_procs *t, struct pollfd *pfd, int *timeout_ms)
{
	int n = 0;
	uint64_t now = sbx_now_ns(), next = UINT64_MAX;
	for (size_t i = 0; i < SBX_PROC_PENDING_MAX; i++) {
		const struct sbx_held *h = &t->held[i];
		if (h->kind == SBX_HELD_NONE)
			continue;
		if (h->kind != SBX_HELD_WRITE && h->deadline_ns < next)
			next = h->deadline_ns;
		if (h->kind == SBX_HELD_WRITE) {
			struct sbx_proc *p = find(t, h->pid);
			if (p && p->in_fd >= 0 && first_write(t, h->pid) == h) {
				t->map[n].slot = (uint16_t)(p - t->proc);
				t->map[n].which = 2;
				pfd[n++] = (struct pollfd){.fd = p->in_fd, .events = POLLOUT};
			}
		}
	}
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++) {
		const struct sbx_proc *p = &t->proc[i];
		if (p->pid == 0)
			continue;
		if (p->out_fd >= 0) {
			t->map[n].slot = (uint16_t)i;
			t->map[n].which = 0;
			pfd[n++] = (struct pollfd){.fd = p->out_fd, .events = POLLIN};
		}
		if (p->err_fd >= 0) {
			t->map[n].slot = (uint16_t)i;
			t->map[n].which = 1;
			pfd[n++] = (struct pollfd){.fd = p->err_fd, .events = POLLIN};
		}
	}
	t->mapped = n;
	if (next != UINT64_MAX) {
		uint64_t ms = next > now ? (next - now + 999999u) / 1000000u : 0;
		if (*timeout_ms < 0 || ms < (uint64_t)*timeout_ms)
			*timeout_ms = (int)ms;
	}
	return n;
}

/* One capped read of a stream into its ring; EOF (or a pty's EIO: every holder of the slave is
 * gone) ends it. */
static void read_stream(struct sbx_procs *t, struct sbx_proc *p, int which)
{
	static uint8_t buf[SBX_PROCS_READ_CAP];
	int *fd = which == 0 ? &p->out_fd : &p->err_fd;
	ssize_t n;
	do
		n = read(*fd, buf, sizeof(buf));
	while (n < 0 && errno == EINTR);
	if (n > 0) {
		sbx_ring_write(which == 0 ? &p->out : &p->err, &t->budget, buf, (size_t)n);
		return;
	}
	if (n < 0 && errno == EAGAIN)
		return;
	if (which == 0)
		p->out_eof = true;
	else
		p->err_eof = true;
	if (p->pty) {
		/* Borrowed: no input without the output either. The master itself stays open while
		 * the process lives (struct sbx_proc). */
		p->in_fd = p->out_fd = -1;
		p->err_eof = true;
		if (!p->running)
			sbx_close_fd(&p->master_fd);
		return;
	}
	sbx_close_fd(fd);
}

void sbx_procs_handle_poll(struct sbx_procs *t, const struct pollfd *pfd, int n)
{
	for (int i = 0; i < n && i < t->mapped; i++) {
		if (!pfd[i].revents)
			continue;
		struct sbx_proc *p = &t->proc[t->map[i].slot];
		int which = t->map[i].which;
		/* The fd may have been closed by an earlier entry this turn (a pty's EIO). */
		if (which == 0 && p->out_fd == pfd[i].fd)
			read_stream(t, p, 0);
		else if (which == 1 && p->err_fd == pfd[i].fd)
			read_stream(t, p, 1);
	}
	answer_ready(t);
}

void sbx_procs_on_child_exit(struct sbx_procs *t, pid_t pid, int status)
{
	struct sbx_proc *p = find(t, pid);
	if (!p || !p->running)
		return;
	p->running = false;
	p->ended = ++t->seq;
	if (WIFEXITED(status))
		p->exit_code = WEXITSTATUS(status);
	else if (WIFSIGNALED(status))
		p->exit_code = 128 + WTERMSIG(status);
	else
		p->exit_code = -1;
	/* Nobody will read its input now (a terminal's master stays open for the output, until
	 * its end). */
	if (p->pty) {
		p->in_fd = -1;
		if (p->out_eof)
			sbx_close_fd(&p->master_fd);
	} else {
		sbx_close_fd(&p->in_fd);
	}
	answer_ready(t);
}

void sbx_procs_abort(struct sbx_procs *t)
{
	sbx_procs_drop_held(t);
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX; i++) {
		struct sbx_proc *p = &t->proc[i];
		if (p->pid > 0 && p->running)
			kill(-p->pid, SIGKILL);
		if (p->pid > 0)
			free_record(t, p);
	}
}

size_t sbx_procs_sessions(pid_t *out, size_t max)
{
	size_t n = 0;
	if (!the_table)
		return 0;
	for (size_t i = 0; i < SBX_PROC_TRACKED_MAX && n < max; i++) {
		const struct sbx_proc *p = &the_table->proc[i];
		if (p->pid > 0 && (p->running || p->out_fd >= 0 || p->err_fd >= 0))
			out[n++] = p->pid;
	}
	return n;
}
