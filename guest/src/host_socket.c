/* The host socket: see host_socket.h. Every byte a client sends is user code's: checked by
 * host_request_guest.c before anything reaches the host, and bounded in memory here. */
#include "host_socket.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cleanup.h"
#include "host_request_guest.h"
#include "repl.h"
#include "runner.h"

/* An ordinary request (a call: name and arguments) fits this; a larger one (an output's data)
 * needs the one big slot (hs->big). */
#define SMALL_REQUEST_MAX (64u * 1024u)
#define READ_CHUNK (64u * 1024u)
/* Per connection and turn of the loop: one client's 4 MiB output must not starve the rest. */
#define READ_BUDGET (256u * 1024u)
/* The largest reply: a TOOL_RESULT's body. */
#define REPLY_PAYLOAD_MAX (1u + 4u + SBX_TOOL_RESULT_MAX)
#define REPLY_FRAME_MAX (SBX_FRAME_HEADER_SIZE + REPLY_PAYLOAD_MAX)
/* A client's requests are read only while less than this of its replies waits: the replies it
 * causes stay small, whatever it sends without reading. */
#define REPLY_PAUSE (64u * 1024u)
/* What may wait for one client: the results of every call in flight (they come from the host
 * whether the client reads or not), plus what its requests caused before the pause took hold.
 * Never reached through those limits; past it the connection is closed. */
#define REPLY_BOUND ((size_t)(SBX_TOOL_CALLS_MAX + 1u) * REPLY_FRAME_MAX)
/* All the replies waiting unread, every connection's together, plus what the calls in flight
 * may still bring: a call is taken only while this holds. A client's own pause (REPLY_PAUSE)
 * leaves each connection up to 16 results of 1 MiB; without a common bound, 16 connections
 * that call and never read would hold 16 times that in PID 1. */
#define REPLY_BUDGET ((size_t)(SBX_TOOL_CALLS_MAX + 1u) * REPLY_FRAME_MAX)
/* A reader this large after a big request gives its memory back. */
#define READER_KEEP (256u * 1024u)

static struct sbx_host_socket *the_socket; /* for sbx_exec_ended, called by runner.c and repl.c */
static char env_entry[sizeof("EXEC_SANDBOX_HOST_SOCKET=") + 108];

/* --- connections ------------------------------------------------------------------------------ */

static size_t reply_pending(const struct sbx_host_conn *c)
{
	return c->out.len - c->out_off;
}

static void conn_close(struct sbx_host_socket *hs, int i)
{
	struct sbx_host_conn *c = &hs->conns[i];
	sbx_close_fd(&c->fd);
	sbx_reader_free(&c->reader);
	sbx_buf_free(&c->out);
	c->out_off = 0;
	c->dead = false;
	if (hs->big == i)
		hs->big = -1;
	/* The host still runs the calls: they stay counted until their results, which are dropped. */
	for (size_t k = 0; k < SBX_TOOL_CALLS_MAX; k++)
		if (hs->calls[k].call && hs->calls[k].conn == i)
			hs->calls[k].conn = -1;
}

/* Write what the socket takes now. A failure marks the connection dead: it is closed at a point
 * where no frame of its reader is in use (sweep). */
static void conn_flush(struct sbx_host_conn *c)
{
	while (!c->dead && c->out_off < c->out.len) {
		ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->out_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		c->dead = true;
	}
	if (c->out_off == c->out.len) {
		c->out.len = 0;
		c->out_off = 0;
		if (c->out.cap > READER_KEEP)
			sbx_buf_free(&c->out);
	} else if (c->out_off >= REPLY_PAUSE) {
		sbx_buf_consume(&c->out, c->out_off);
		c->out_off = 0;
	}
}

static void reply(struct sbx_host_socket *hs, int i, uint32_t id, uint8_t status, const void *body,
		  size_t len)
{
	struct sbx_host_conn *c = &hs->conns[i];
	if (c->fd < 0 || c->dead)
		return;
	if (reply_pending(c) + SBX_FRAME_HEADER_SIZE + 5u + len > REPLY_BOUND) {
		sbx_log("host socket: a client does not read its replies; closing it");
		c->dead = true;
		return;
	}
	size_t start;
	int rc = sbx_frame_begin(&c->out, SBX_LOCAL_REPLY, id, &start);
	if (rc == 0)
		rc = sbx_put_u8(&c->out, status);
	if (rc == 0)
		rc = sbx_put_str(&c->out, body, len);
	if (rc == 0)
		rc = sbx_frame_end(&c->out, start, REPLY_PAYLOAD_MAX);
	else
		c->out.len = start;
	if (rc < 0) {
		/* A request without its reply would hang the client: better it sees the end. */
		sbx_log("host socket: reply: %s; closing the client", strerror(-rc));
		c->dead = true;
		return;
	}
	conn_flush(c);
}

static void refuse(struct sbx_host_socket *hs, int i, uint32_t id, const char *why)
{
	reply(hs, i, id, SBX_TOOL_REFUSED, why, strlen(why));
}

/* --- executions ------------------------------------------------------------------------------- */

/* The execution running now, whose id the frames carry: the one-shot run or the session's
 * request. Not one whose host has gone (silent): nothing could reach it. */
static bool running_exec(const struct sbx_host_socket *hs, uint32_t *id)
{
	if (sbx_runner_busy(hs->runner) && !hs->runner->silent) {
		*id = hs->runner->id;
		return true;
	}
	if (sbx_repl_busy(hs->repl) && !hs->repl->silent) {
		*id = hs->repl->id;
		return true;
	}
	return false;
}

static void end_exec(struct sbx_host_socket *hs)
{
	static const char ended[] = "the execution ended";
	for (size_t k = 0; k < SBX_TOOL_CALLS_MAX; k++) {
		struct sbx_host_call *call = &hs->calls[k];
		if (!call->call)
			continue;
		if (call->conn >= 0)
			reply(hs, call->conn, call->req_id, SBX_TOOL_REFUSED, ended, sizeof(ended) - 1);
		*call = (struct sbx_host_call){.conn = -1};
	}
	hs->exec_active = false;
	hs->outputs = 0;
	hs->output_bytes = 0;
}

/* Make the calls and counters those of the execution running now. The runner and the REPL say
 * when one ends (sbx_exec_ended); this also catches any end they did not report. */
static bool sync_exec(struct sbx_host_socket *hs)
{
	uint32_t id = 0;
	bool running = running_exec(hs, &id);
	if (hs->exec_active && (!running || id != hs->exec_id))
		end_exec(hs);
	if (running && !hs->exec_active) {
		hs->exec_active = true;
		hs->exec_id = id;
	}
	return running;
}

void sbx_exec_ended(uint32_t id)
{
	struct sbx_host_socket *hs = the_socket;
	if (hs && hs->exec_active && hs->exec_id == id)
		end_exec(hs);
}

const char *sbx_host_socket_env(void)
{
	return env_entry[0] ? env_entry : NULL;
}

/* --- requests --------------------------------------------------------------------------------- */

static void do_call(struct sbx_host_socket *hs, int i, uint32_t req_id,
		    const struct sbx_local_request *req)
{
	struct sbx_host_call *slot = NULL;
	for (size_t k = 0; k < SBX_TOOL_CALLS_MAX; k++)
		if (!hs->calls[k].call) {
			slot = &hs->calls[k];
			break;
		}
	if (!slot) {
		refuse(hs, i, req_id, "too many calls of this execution in flight (16)");
		return;
	}
	size_t held = 0, in_flight = 0;
	for (size_t k = 0; k < SBX_HOST_SOCKET_CLIENTS_MAX; k++)
		if (hs->conns[k].fd >= 0)
			held += reply_pending(&hs->conns[k]);
	for (size_t k = 0; k < SBX_TOOL_CALLS_MAX; k++)
		in_flight += hs->calls[k].call != 0;
	if (held + (in_flight + 1u) * REPLY_FRAME_MAX > REPLY_BUDGET) {
		refuse(hs, i, req_id, "the results of earlier calls wait unread by their clients");
		return;
	}
	/* Numbers are never reused while a call holds one, and wrap only after 2^32 calls: a late
	 * TOOL_RESULT of an ended execution finds nothing. */
	uint32_t call;
	bool taken;
	do {
		call = ++hs->next_call;
		taken = call == 0;
		for (size_t k = 0; k < SBX_TOOL_CALLS_MAX && !taken; k++)
			taken = hs->calls[k].call == call;
	} while (taken);
	struct sbx_buf b = {0};
	int rc = sbx_put_u32(&b, call);
	if (rc == 0)
		rc = sbx_put_str(&b, req->name, req->name_len);
	if (rc == 0)
		rc = sbx_put_str(&b, req->args, req->args_len);
	if (rc == 0)
		rc = sbx_channel_send(hs->ch, SBX_MSG_TOOL_CALL, hs->exec_id, b.data, b.len);
	sbx_buf_free(&b);
	if (rc < 0) {
		char why[128];
		snprintf(why, sizeof(why), "the call could not be sent to the host: %s",
			 strerror(-rc));
		refuse(hs, i, req_id, why);
		return;
	}
	*slot = (struct sbx_host_call){.call = call, .req_id = req_id, .conn = i};
}

/* Queue the whole output, BEGIN (with its type) first and END on the last frame, before the
 * reply: an output acknowledged before the code ends is on the channel before its EXIT. The
 * channel's queue takes it at once (at most one output past the high-water mark: requests are
 * taken only below it), so no frame waits here and none can come after the EXIT. */
static void do_output(struct sbx_host_socket *hs, int i, uint32_t req_id,
		      const struct sbx_local_request *req)
{
	if (hs->outputs >= SBX_OUTPUTS_MAX) {
		refuse(hs, i, req_id, "too many outputs in this execution (32)");
		return;
	}
	if (hs->output_bytes + req->data_len > SBX_OUTPUT_BYTES_MAX) {
		refuse(hs, i, req_id, "the outputs of this execution would pass 16 MiB");
		return;
	}
	hs->outputs++;
	hs->output_bytes += req->data_len;
	struct sbx_buf b = {0};
	uint32_t off = 0;
	int rc = 0;
	do {
		uint32_t n = req->data_len - off;
		if (n > SBX_OUTPUT_DATA_MAX)
			n = SBX_OUTPUT_DATA_MAX;
		uint8_t flags = (off == 0 ? SBX_OUTPUT_BEGIN : 0) |
				(off + n == req->data_len ? SBX_OUTPUT_END : 0);
		b.len = 0;
		rc = sbx_put_u8(&b, flags);
		if (rc == 0 && off == 0)
			rc = sbx_put_str(&b, req->mime, req->mime_len);
		if (rc == 0)
			rc = sbx_buf_append(&b, req->data + off, n);
		if (rc == 0)
			rc = sbx_channel_send(hs->ch, SBX_MSG_OUTPUT, hs->exec_id, b.data, b.len);
		off += n;
	} while (rc == 0 && off < req->data_len);
	sbx_buf_free(&b);
	if (rc < 0) {
		/* Only out of memory (or a host gone, which drops the queue anyway): the host then
		 * sees an output without its END, a broken agent's sign, and this client an error. */
		char why[128];
		sbx_log("host socket: queuing an output: %s", strerror(-rc));
		snprintf(why, sizeof(why), "the output could not be queued: %s", strerror(-rc));
		refuse(hs, i, req_id, why);
		return;
	}
	reply(hs, i, req_id, SBX_TOOL_OK, NULL, 0);
}

static void handle_request(struct sbx_host_socket *hs, int i, const struct sbx_frame *f)
{
	struct sbx_local_request req;
	const char *why = "?";
	if (sbx_parse_local_request(f->type, f->payload, f->payload_len, &req, &why) < 0) {
		refuse(hs, i, f->id, why);
		return;
	}
	if (!sync_exec(hs)) {
		refuse(hs, i, f->id, "no execution is running");
		return;
	}
	if (req.type == SBX_LOCAL_CALL)
		do_call(hs, i, f->id, &req);
	else
		do_output(hs, i, f->id, &req);
}

void sbx_host_socket_on_tool_result(struct sbx_host_socket *hs, const struct sbx_frame *f)
{
	struct sbx_tool_result res;
	const char *why = "?";
	if (sbx_parse_tool_result(f->payload, f->payload_len, &res, &why) < 0) {
		/* No ERROR back: its id is the execution's, whose result it would end. */
		sbx_log("malformed TOOL_RESULT for %u: %s; ignored", f->id, why);
		return;
	}
	/* A call of an execution that ended was answered then: its late result has no taker. */
	sync_exec(hs);
	if (!hs->exec_active || f->id != hs->exec_id)
		return;
	for (size_t k = 0; k < SBX_TOOL_CALLS_MAX; k++) {
		struct sbx_host_call *call = &hs->calls[k];
		if (call->call != res.call)
			continue;
		int conn = call->conn;
		uint32_t req_id = call->req_id;
		*call = (struct sbx_host_call){.conn = -1};
		if (conn >= 0) {
			reply(hs, conn, req_id, res.status, res.body, res.body_len);
			if (hs->conns[conn].dead)
				conn_close(hs, conn); /* not inside its reader here */
		}
		return;
	}
}

/* --- reading ---------------------------------------------------------------------------------- */

/* Whether the frame at the head of the reader announces a large request. */
static bool head_is_big(const struct sbx_host_conn *c)
{
	const struct sbx_reader *r = &c->reader;
	if (r->buf.len - r->consumed < SBX_FRAME_HEADER_SIZE)
		return false;
	const uint8_t *h = r->buf.data + r->consumed;
	uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
		       (uint32_t)h[3] << 24;
	return len > SMALL_REQUEST_MAX;
}

/* Requests are taken only while the host takes output and the client takes its replies. */
static bool takes_requests(const struct sbx_host_socket *hs, const struct sbx_host_conn *c)
{
	return !c->dead && sbx_channel_wants_output(hs->ch) && reply_pending(c) < REPLY_PAUSE;
}

/* Reading on is allowed unless the request under way is large and another connection holds
 * the big slot. */
static bool may_read(const struct sbx_host_socket *hs, int i)
{
	return !head_is_big(&hs->conns[i]) || hs->big < 0 || hs->big == i;
}

/* Take the complete requests, as far as the client and the channel allow. */
static void take_frames(struct sbx_host_socket *hs, int i)
{
	struct sbx_host_conn *c = &hs->conns[i];
	while (takes_requests(hs, c)) {
		struct sbx_frame f;
		int rc = sbx_reader_next(&c->reader, &f);
		if (rc == 0)
			break;
		if (rc < 0) {
			sbx_log("host socket: malformed frame from a client (%s); closing it",
				strerror(-rc));
			c->dead = true;
			return;
		}
		handle_request(hs, i, &f);
	}
	if (hs->big == i && !head_is_big(c))
		hs->big = -1;
	/* Give a large request's memory back once it is done with. */
	if (c->reader.consumed == c->reader.buf.len && c->reader.buf.cap > READER_KEEP) {
		sbx_reader_free(&c->reader);
		sbx_reader_init(&c->reader, SBX_LOCAL_FRAME_MAX);
	}
}

/* One read into the reader: bytes read, 0 when there is nothing now; the connection is marked
 * dead at its end or on an error. */
static size_t read_chunk(struct sbx_host_socket *hs, int i)
{
	struct sbx_host_conn *c = &hs->conns[i];
	if (head_is_big(c))
		hs->big = i; /* may_read said it is free or ours */
	uint8_t *at;
	int rc = sbx_reader_space(&c->reader, READ_CHUNK, &at);
	if (rc < 0) {
		sbx_log("host socket: client request too large (%s); closing it", strerror(-rc));
		c->dead = true;
		return 0;
	}
	for (;;) {
		ssize_t n = recv(c->fd, at, READ_CHUNK, MSG_DONTWAIT);
		if (n > 0) {
			sbx_reader_commit(&c->reader, (size_t)n);
			return (size_t)n;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		/* End of stream: a client that leaves gives up its replies. */
		c->dead = true;
		return 0;
	}
}

static void service(struct sbx_host_socket *hs, int i, bool readable)
{
	struct sbx_host_conn *c = &hs->conns[i];
	size_t budget = READ_BUDGET;
	for (;;) {
		take_frames(hs, i);
		if (!readable || budget == 0 || !takes_requests(hs, c) || !may_read(hs, i))
			return;
		size_t n = read_chunk(hs, i);
		if (n == 0)
			return;
		budget = n >= budget ? 0 : budget - n;
	}
}

static void accept_clients(struct sbx_host_socket *hs)
{
	for (unsigned k = 0; k < 2 * SBX_HOST_SOCKET_CLIENTS_MAX; k++) {
		int fd = accept4(hs->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			int e = errno;
			if (e == EINTR || e == ECONNABORTED)
				continue;
			if (e != EAGAIN && e != EWOULDBLOCK)
				sbx_log("host socket: accept: %s", strerror(e));
			return;
		}
		int slot = -1;
		for (int i = 0; i < (int)SBX_HOST_SOCKET_CLIENTS_MAX; i++)
			if (hs->conns[i].fd < 0) {
				slot = i;
				break;
			}
		if (slot < 0) {
			close(fd); /* over the limit: the client sees its end at once */
			continue;
		}
		struct sbx_host_conn *c = &hs->conns[slot];
		memset(c, 0, sizeof(*c));
		c->fd = fd;
		sbx_reader_init(&c->reader, SBX_LOCAL_FRAME_MAX);
	}
}

/* --- the loop --------------------------------------------------------------------------------- */

void sbx_host_socket_init(struct sbx_host_socket *hs, const struct sbx_config *cfg,
			  struct sbx_channel *ch, const struct sbx_runner *runner,
			  const struct sbx_repl *repl)
{
	memset(hs, 0, sizeof(*hs));
	hs->ch = ch;
	hs->runner = runner;
	hs->repl = repl;
	hs->listen_fd = -1;
	hs->big = -1;
	for (size_t i = 0; i < SBX_HOST_SOCKET_CLIENTS_MAX; i++)
		hs->conns[i].fd = -1;
	for (size_t k = 0; k < SBX_TOOL_CALLS_MAX; k++)
		hs->calls[k].conn = -1;
	the_socket = hs;

	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int n = snprintf(hs->path, sizeof(hs->path), "%s/" SBX_HOST_SOCKET_NAME, cfg->run_dir);
	if (n < 0 || (size_t)n >= sizeof(hs->path) || (size_t)n >= sizeof(addr.sun_path)) {
		sbx_log("host socket: path too long under %s", cfg->run_dir);
		hs->path[0] = '\0';
		return;
	}
	memcpy(addr.sun_path, hs->path, (size_t)n + 1);
	if (strcmp(hs->path, SBX_RUN_DIR "/" SBX_HOST_SOCKET_NAME) != 0)
		snprintf(env_entry, sizeof(env_entry), "EXEC_SANDBOX_HOST_SOCKET=%s", hs->path);

	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		sbx_log("host socket: socket: %s", strerror(errno));
		return;
	}
	/* Whatever was left there (a test's work directory used again) gives way. */
	if (unlink(hs->path) < 0 && errno != ENOENT)
		sbx_log("host socket: unlink %s: %s", hs->path, strerror(errno));
	if (bind(fd, (const struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    chmod(hs->path, 0666) < 0 || listen(fd, (int)SBX_HOST_SOCKET_CLIENTS_MAX) < 0) {
		sbx_log("host socket: %s: %s", hs->path, strerror(errno));
		unlink(hs->path);
		return;
	}
	hs->listen_fd = TAKE_FD(fd);
}

int sbx_host_socket_poll(struct sbx_host_socket *hs, struct pollfd *p)
{
	int n = 0;
	if (hs->listen_fd >= 0) {
		hs->polled[n] = -1;
		p[n++] = (struct pollfd){.fd = hs->listen_fd, .events = POLLIN};
	}
	for (int i = 0; i < (int)SBX_HOST_SOCKET_CLIENTS_MAX; i++) {
		struct sbx_host_conn *c = &hs->conns[i];
		if (c->fd < 0)
			continue;
		short ev = 0;
		if (takes_requests(hs, c) && may_read(hs, i))
			ev |= POLLIN;
		if (reply_pending(c))
			ev |= POLLOUT;
		/* Always there, even without events: a client's hang-up is noticed at once. */
		hs->polled[n] = i;
		p[n++] = (struct pollfd){.fd = c->fd, .events = ev};
	}
	return n;
}

static void sweep(struct sbx_host_socket *hs)
{
	for (int i = 0; i < (int)SBX_HOST_SOCKET_CLIENTS_MAX; i++)
		if (hs->conns[i].fd >= 0 && hs->conns[i].dead)
			conn_close(hs, i);
}

void sbx_host_socket_handle(struct sbx_host_socket *hs, const struct pollfd *p, int n)
{
	bool readable[SBX_HOST_SOCKET_CLIENTS_MAX] = {false};
	bool hung_up[SBX_HOST_SOCKET_CLIENTS_MAX] = {false};
	for (int k = 0; k < n; k++) {
		short re = p[k].revents;
		int i = hs->polled[k];
		if (!re)
			continue;
		if (i < 0) {
			if (hs->listen_fd >= 0 && p[k].fd == hs->listen_fd)
				accept_clients(hs);
			continue;
		}
		struct sbx_host_conn *c = &hs->conns[i];
		if (c->fd != p[k].fd)
			continue;
		if (re & (POLLERR | POLLNVAL)) {
			c->dead = true;
			continue;
		}
		if (re & POLLOUT)
			conn_flush(c);
		if (re & (POLLIN | POLLHUP))
			readable[i] = true;
		if (re & POLLHUP)
			hung_up[i] = true;
	}
	/* Every connection, polled or not: requests that waited for the channel or for the client
	 * to read its replies go on now if they can. */
	for (int i = 0; i < (int)SBX_HOST_SOCKET_CLIENTS_MAX; i++) {
		if (hs->conns[i].fd < 0)
			continue;
		service(hs, i, readable[i]);
		/* Gone both ways: nobody takes a reply, and a hang-up would wake every poll. */
		if (hung_up[i])
			hs->conns[i].dead = true;
	}
	sweep(hs);
}
