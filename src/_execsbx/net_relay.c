/* See net_relay.h. One io_uring per scheduler; per relay (VM) one outstanding read and one
 * outstanding write on the NET port; per stream at most one recv and one send on its socket.
 *
 * Every buffer an operation points at stays put until that operation's completion arrives: the
 * port's outgoing bytes go through two buffers (one being written, one filling), a stream's bytes
 * to its socket through a fixed ring of SBX_NET_WINDOW bytes, its bytes from its socket through a
 * fixed buffer of SBX_NET_DATA_MAX. A stream or relay that is gone is unlinked at once (its id is
 * free) and its memory freed when its last operation completes (cancelled ones included).
 *
 * Operations on an fd opened O_NONBLOCK may complete with -EAGAIN; they then wait with a POLL_ADD
 * and are issued again, so that Python can hand over sockets in either mode. */
#include "net_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "frame.h"
#include "net_wire.h"

#define HOST_STREAM_BIT 0x80000000u
#define PORT_READ_CHUNK (SBX_NET_FRAME_MAX + SBX_FRAME_HEADER_SIZE)
#define RECENT_IDS 64u

enum op_kind { OP_PORT_READ, OP_PORT_WRITE, OP_SOCK_RECV, OP_SOCK_SEND };

/* One kind of operation of one owner; its address is the SQE's user_data (0: a cancel). */
struct op {
	enum op_kind kind;
	int busy;    /* submitted, completion not seen yet */
	int polling; /* the submitted operation is the POLL_ADD that waits for readiness */
	void *owner; /* struct relay (port ops) or struct stream (socket ops) */
};

enum stream_state {
	S_OPENING,    /* guest sent OPEN; Python decides (sbx_net_open_reply) */
	S_CONNECTING, /* host sent CONNECT; the guest answers CONNECTED */
	S_OPEN,       /* relaying */
	S_CLOSING,    /* host sent CLOSE; waiting for the guest's CLOSE to free the id */
};

struct relay;

struct stream {
	struct relay *relay;
	struct stream *next;
	uint32_t id;
	int fd; /* owned; -1 until OPENED */
	enum stream_state state;
	struct op recv_op, send_op;
	uint8_t *rbuf;  /* socket -> guest, SBX_NET_DATA_MAX */
	uint8_t *wring; /* guest -> socket, SBX_NET_WINDOW, a ring */
	uint32_t whead, wlen;
	uint32_t in_uncredited; /* guest bytes received and not credited back (<= window) */
	uint32_t credit_owed;   /* of those, bytes written to the socket: the next CREDIT */
	uint32_t out_unacked;   /* bytes sent to the guest it has not credited back */
	int guest_shut, wr_shut_done, sock_eof, eof_sent;
	int closed_by_guest; /* its CLOSE(0) came while bytes for the socket were still queued */
	int detached; /* the id is free; freed by reap() once no operation is busy */
	uint64_t to_guest, from_guest;
};

struct relay {
	struct sbx_net_ring *ring;
	struct relay *next;
	uint32_t id;
	int fd;
	int is_socket; /* recv/send (io_uring waits on a socket itself, O_NONBLOCK or not) */
	int dead;      /* failed, port closed or closed by the owner: no more frames */
	int forgotten; /* sbx_net_relay_close called: the id is free */
	struct op read_op, write_op;
	uint8_t *rbuf;
	struct sbx_reader reader;
	struct sbx_buf outq, outfly;
	size_t fly_off;
	struct stream *streams; /* live ids */
	struct stream *zombies; /* unlinked, waiting for their operations */
	unsigned n_streams, n_guest_streams;
	uint32_t next_host_id;
	uint32_t recent[RECENT_IDS]; /* guest may still send CREDIT/CLOSE for these */
	unsigned recent_pos;
	/* NET_REFUSED reports: a token bucket (SBX_NET_RELAY_REFUSALS_*), refilled by the clock,
	 * and what it left out, told Python with the next one let through. */
	uint32_t refusal_tokens;
	uint64_t refusal_refill_ns;
	uint64_t refusals_dropped;
};

struct sbx_net_ring {
	struct io_uring uring;
	int efd;
	struct relay *relays;
	uint32_t next_relay_id;
	struct sbx_net_event *evs;
	size_t ev_head, ev_len, ev_cap;
	int error; /* sticky -ENOMEM from the event queue */
};

static void relay_fail(struct relay *rl, enum sbx_net_event_kind kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
struct stream;
static void finish_guest_close(struct stream *s, uint32_t code);

/* ---- events ---- */

static struct sbx_net_event *push_event(struct sbx_net_ring *r, enum sbx_net_event_kind kind,
					uint32_t relay, uint32_t stream)
{
	if (r->ev_head + r->ev_len == r->ev_cap) {
		if (r->ev_head > 0) {
			memmove(r->evs, r->evs + r->ev_head, r->ev_len * sizeof(*r->evs));
			r->ev_head = 0;
		} else {
			size_t cap = r->ev_cap ? r->ev_cap * 2 : 64;
			struct sbx_net_event *evs = realloc(r->evs, cap * sizeof(*evs));
			if (!evs) {
				r->error = -ENOMEM;
				return NULL;
			}
			r->evs = evs;
			r->ev_cap = cap;
		}
	}
	struct sbx_net_event *ev = &r->evs[r->ev_head + r->ev_len++];
	memset(ev, 0, sizeof(*ev));
	ev->kind = kind;
	ev->relay = relay;
	ev->stream = stream;
	return ev;
}

int sbx_net_ring_next_event(struct sbx_net_ring *r, struct sbx_net_event *ev)
{
	if (r->ev_len == 0)
		return 0;
	*ev = r->evs[r->ev_head++];
	if (--r->ev_len == 0)
		r->ev_head = 0;
	return 1;
}

/* ---- submissions ---- */

static struct io_uring_sqe *get_sqe(struct sbx_net_ring *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->uring);
	if (!sqe) {
		io_uring_submit(&r->uring);
		sqe = io_uring_get_sqe(&r->uring);
	}
	return sqe;
}

static int submit_op(struct op *op);

static int cancel_op(struct sbx_net_ring *r, struct op *op)
{
	if (!op->busy)
		return 0;
	struct io_uring_sqe *sqe = get_sqe(r);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_cancel(sqe, op, 0);
	io_uring_sqe_set_data64(sqe, 0);
	return 0;
}

/* ---- streams ---- */

static struct stream *find_stream(struct relay *rl, uint32_t id)
{
	for (struct stream *s = rl->streams; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

static int is_recent(const struct relay *rl, uint32_t id)
{
	for (unsigned i = 0; i < RECENT_IDS; i++)
		if (rl->recent[i] == id)
			return 1;
	return 0;
}

static void remember(struct relay *rl, uint32_t id)
{
	rl->recent[rl->recent_pos++ % RECENT_IDS] = id;
}

static void free_stream(struct stream *s)
{
	if (s->fd >= 0)
		close(s->fd);
	free(s->rbuf);
	free(s->wring);
	free(s);
}

/* Stop the socket side: wake its operations (shutdown) and cancel them. The fd is closed when the
 * stream is freed, so no operation ever sees a reused fd number. */
static void kill_socket(struct stream *s)
{
	if (s->fd >= 0)
		shutdown(s->fd, SHUT_RDWR);
	cancel_op(s->relay->ring, &s->recv_op);
	cancel_op(s->relay->ring, &s->send_op);
}

/* Free the id; the memory goes when the operations have ended. */
static void detach_stream(struct stream *s)
{
	struct relay *rl = s->relay;
	for (struct stream **p = &rl->streams; *p; p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			break;
		}
	rl->n_streams--;
	if (!(s->id & HOST_STREAM_BIT))
		rl->n_guest_streams--;
	kill_socket(s);
	s->detached = 1;
	s->next = rl->zombies;
	rl->zombies = s;
}

static struct stream *new_stream(struct relay *rl, uint32_t id, enum stream_state state, int fd)
{
	struct stream *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->rbuf = malloc(SBX_NET_DATA_MAX);
	s->wring = malloc(SBX_NET_WINDOW);
	if (!s->rbuf || !s->wring) {
		free(s->rbuf);
		free(s->wring);
		free(s);
		return NULL;
	}
	s->relay = rl;
	s->id = id;
	s->fd = fd;
	s->state = state;
	s->recv_op = (struct op){.kind = OP_SOCK_RECV, .owner = s};
	s->send_op = (struct op){.kind = OP_SOCK_SEND, .owner = s};
	s->next = rl->streams;
	rl->streams = s;
	rl->n_streams++;
	if (!(id & HOST_STREAM_BIT))
		rl->n_guest_streams++;
	return s;
}

/* ---- the port's outgoing queue ---- */

static int check_out_room(struct relay *rl)
{
	if (rl->outq.len + rl->outfly.len > SBX_NET_RELAY_OUT_MAX) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "the guest does not read its net port");
		return -ENOBUFS;
	}
	return 0;
}

static int queue_u32_frame(struct relay *rl, uint8_t type, uint32_t id, uint32_t value)
{
	size_t start;
	int err;
	if ((err = sbx_frame_begin(&rl->outq, type, id, &start)) < 0 ||
	    (err = sbx_put_u32(&rl->outq, value)) < 0 ||
	    (err = sbx_frame_end(&rl->outq, start, SBX_NET_FRAME_MAX)) < 0)
		return err;
	return check_out_room(rl);
}

static int queue_bytes_frame(struct relay *rl, uint8_t type, uint32_t id, const void *data,
			     size_t n)
{
	size_t start;
	int err;
	if ((err = sbx_frame_begin(&rl->outq, type, id, &start)) < 0 ||
	    (n > 0 && (err = sbx_buf_append(&rl->outq, data, n)) < 0) ||
	    (err = sbx_frame_end(&rl->outq, start, SBX_NET_FRAME_MAX)) < 0)
		return err;
	return check_out_room(rl);
}

static int queue_opened(struct relay *rl, uint32_t id, uint32_t status, const char *reason,
			size_t n)
{
	size_t start;
	int err;
	if (n > SBX_NET_MESSAGE_MAX)
		n = SBX_NET_MESSAGE_MAX;
	if ((err = sbx_frame_begin(&rl->outq, SBX_NET_MSG_OPENED, id, &start)) < 0 ||
	    (err = sbx_put_u32(&rl->outq, status)) < 0 ||
	    (err = sbx_put_str(&rl->outq, reason, n)) < 0 ||
	    (err = sbx_frame_end(&rl->outq, start, SBX_NET_FRAME_MAX)) < 0)
		return err;
	return check_out_room(rl);
}

/* Start the next port write if none is in flight. CREDIT frames are built only here, when no
 * write is in flight: credits then coalesce into one frame per stream per write, so a guest that
 * sends tiny DATA frames and does not read cannot make the queue grow by a frame each. */
static void flush_port(struct relay *rl)
{
	if (rl->dead || rl->write_op.busy)
		return;
	for (struct stream *s = rl->streams; s; s = s->next) {
		if (s->credit_owed == 0 || s->state == S_CLOSING)
			continue;
		if (queue_u32_frame(rl, SBX_NET_MSG_CREDIT, s->id, s->credit_owed) < 0)
			return;
		s->in_uncredited -= s->credit_owed;
		s->credit_owed = 0;
	}
	if (rl->fly_off == rl->outfly.len && rl->outq.len > 0) {
		struct sbx_buf t = rl->outfly;
		rl->outfly = rl->outq;
		rl->outq = t;
		rl->outq.len = 0;
		rl->fly_off = 0;
	}
	if (rl->fly_off < rl->outfly.len && submit_op(&rl->write_op) < 0)
		relay_fail(rl, SBX_NET_EV_VIOLATION, "io_uring submission queue full");
}

/* ---- stream byte path ---- */

static void arm_stream(struct stream *s)
{
	struct relay *rl = s->relay;
	if (rl->dead || s->detached || s->state != S_OPEN || s->fd < 0)
		return;
	int err = 0;
	if (!s->recv_op.busy && !s->sock_eof && !s->closed_by_guest && s->out_unacked < SBX_NET_WINDOW)
		err = submit_op(&s->recv_op);
	if (!err && !s->send_op.busy && s->wlen > 0)
		err = submit_op(&s->send_op);
	if (err < 0)
		relay_fail(rl, SBX_NET_EV_VIOLATION, "io_uring submission queue full");
}

/* The host ends the stream: CLOSE to the guest, CLOSED to Python; the id stays taken until the
 * guest's CLOSE arrives. */
static void close_from_host(struct stream *s, uint32_t code)
{
	struct relay *rl = s->relay;
	if (s->detached || s->state == S_CLOSING)
		return;
	if (s->closed_by_guest) { /* the guest's CLOSE came already: answer it, free the id */
		finish_guest_close(s, code);
		return;
	}
	s->state = S_CLOSING;
	kill_socket(s);
	struct sbx_net_event *ev = push_event(rl->ring, SBX_NET_EV_CLOSED, rl->id, s->id);
	if (ev) {
		ev->status = code;
		ev->bytes_to_guest = s->to_guest;
		ev->bytes_from_guest = s->from_guest;
	}
	if (queue_u32_frame(rl, SBX_NET_MSG_CLOSE, s->id, code) == 0)
		flush_port(rl);
}

static void check_done(struct stream *s)
{
	if (!s->detached && s->state == S_OPEN && s->guest_shut && s->wlen == 0 && s->wr_shut_done && s->sock_eof &&
	    s->eof_sent)
		close_from_host(s, SBX_NET_CLOSE_DONE);
}

static void shut_write_if_drained(struct stream *s)
{
	if (!s->detached && s->state == S_OPEN && s->fd >= 0 && s->guest_shut && s->wlen == 0 && !s->wr_shut_done) {
		shutdown(s->fd, SHUT_WR);
		s->wr_shut_done = 1;
	}
}

static void on_recv(struct stream *s, int res)
{
	struct relay *rl = s->relay;
	if (res > 0) {
		if (queue_bytes_frame(rl, SBX_NET_MSG_DATA, s->id, s->rbuf, (size_t)res) < 0)
			return;
		s->out_unacked += (uint32_t)res;
		s->to_guest += (uint64_t)res;
		arm_stream(s);
		flush_port(rl);
	} else if (res == 0) {
		s->sock_eof = 1;
		if (queue_bytes_frame(rl, SBX_NET_MSG_SHUTDOWN, s->id, NULL, 0) < 0)
			return;
		s->eof_sent = 1;
		flush_port(rl);
		check_done(s);
	} else {
		close_from_host(s, SBX_NET_CLOSE_RESET);
	}
}

static void on_send(struct stream *s, int res)
{
	if (res <= 0) {
		close_from_host(s, SBX_NET_CLOSE_RESET);
		return;
	}
	uint32_t n = (uint32_t)res;
	s->whead = (s->whead + n) % SBX_NET_WINDOW;
	s->wlen -= n;
	s->from_guest += n;
	s->credit_owed += n;
	shut_write_if_drained(s);
	if (s->closed_by_guest && s->wlen == 0) {
		finish_guest_close(s, SBX_NET_CLOSE_DONE);
		return;
	}
	arm_stream(s);
	flush_port(s->relay);
	check_done(s);
}

/* ---- frames from the guest ---- */

/* An event about the OPEN frame f: its name and port (the decoder bounded the name's length). */
static void push_open_event(struct relay *rl, enum sbx_net_event_kind kind,
			    const struct sbx_net_frame *f, uint32_t status)
{
	struct sbx_net_event *ev = push_event(rl->ring, kind, rl->id, f->stream);
	if (ev) {
		ev->port = f->value;
		ev->status = status;
		memcpy(ev->text, f->data, f->len);
		ev->text[f->len] = '\0';
	}
}

static void on_open(struct relay *rl, const struct sbx_net_frame *f)
{
	if (find_stream(rl, f->stream)) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "OPEN for live stream %u", f->stream);
		return;
	}
	if (rl->n_guest_streams >= SBX_NET_STREAMS_MAX) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "more than %u streams", SBX_NET_STREAMS_MAX);
		return;
	}
	if (rl->n_streams >= SBX_NET_STREAMS_MAX) { /* host streams fill the table */
		static const char why[] = "too many streams";
		remember(rl, f->stream);
		if (queue_opened(rl, f->stream, SBX_NET_TOO_MANY, why, sizeof(why) - 1) == 0)
			flush_port(rl);
		/* A connection attempt all the same: Python logs it (the audit log misses none). */
		push_open_event(rl, SBX_NET_EV_REFUSED, f, SBX_NET_TOO_MANY);
		return;
	}
	if (!new_stream(rl, f->stream, S_OPENING, -1)) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "out of memory");
		return;
	}
	push_open_event(rl, SBX_NET_EV_OPEN, f, SBX_NET_OK);
}

static void on_data(struct relay *rl, struct stream *s, const struct sbx_net_frame *f)
{
	if (s->state == S_CONNECTING || s->guest_shut) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "DATA on stream %u before CONNECTED or after "
			   "SHUTDOWN", s->id);
		return;
	}
	if (f->len > SBX_NET_WINDOW - s->in_uncredited) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "window overrun on stream %u", s->id);
		return;
	}
	s->in_uncredited += f->len;
	uint32_t tail = (s->whead + s->wlen) % SBX_NET_WINDOW;
	uint32_t first = SBX_NET_WINDOW - tail;
	if (first > f->len)
		first = f->len;
	memcpy(s->wring + tail, f->data, first);
	memcpy(s->wring, f->data + first, f->len - first);
	s->wlen += f->len;
	arm_stream(s);
}

/* The guest's CLOSE takes effect: CLOSED to Python, CLOSE answered, the id freed. */
static void finish_guest_close(struct stream *s, uint32_t code)
{
	struct relay *rl = s->relay;
	remember(rl, s->id);
	struct sbx_net_event *ev = push_event(rl->ring, SBX_NET_EV_CLOSED, rl->id, s->id);
	if (ev) {
		ev->status = code;
		ev->bytes_to_guest = s->to_guest;
		ev->bytes_from_guest = s->from_guest;
	}
	if (s->state != S_OPENING &&
	    queue_u32_frame(rl, SBX_NET_MSG_CLOSE, s->id, SBX_NET_CLOSE_DONE) < 0)
		return;
	flush_port(rl);
	detach_stream(s);
}

static void on_close(struct relay *rl, struct stream *s, const struct sbx_net_frame *f)
{
	if (s->state == S_CLOSING) {
		remember(rl, s->id);
		detach_stream(s);
		return;
	}
	if (s->state == S_OPEN && f->value == SBX_NET_CLOSE_DONE && s->wlen > 0 && s->fd >= 0) {
		/* A graceful close: the bytes it sent before still go to the peer, then the write
		 * side shuts, then the CLOSE is answered (the id stays taken until then). */
		s->guest_shut = 1;
		s->closed_by_guest = 1;
		return;
	}
	finish_guest_close(s, f->value);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A NET_REFUSED: an event for the log, within the relay's own bound whatever the guest sends
 * (dropped ones are counted and reported as one REFUSAL_DROPPED with the next let through). */
static void on_refused(struct relay *rl, const struct sbx_net_frame *f)
{
	const uint64_t period = 1000000000u / SBX_NET_RELAY_REFUSALS_PER_SECOND;
	uint64_t now = now_ns();
	if (rl->refusal_refill_ns == 0) {
		rl->refusal_tokens = SBX_NET_RELAY_REFUSALS_BURST;
		rl->refusal_refill_ns = now;
	} else if (now - rl->refusal_refill_ns >= period) {
		uint64_t add = (now - rl->refusal_refill_ns) / period;
		rl->refusal_tokens = (uint32_t)(add >= SBX_NET_RELAY_REFUSALS_BURST - rl->refusal_tokens
						    ? SBX_NET_RELAY_REFUSALS_BURST
						    : rl->refusal_tokens + add);
		rl->refusal_refill_ns += add * period;
	}
	uint64_t count = f->count;
	if (rl->refusal_tokens == 0) {
		rl->refusals_dropped += count;
		return;
	}
	rl->refusal_tokens--;
	if (f->value == SBX_NET_REFUSAL_DROPPED) {
		count += rl->refusals_dropped;
		rl->refusals_dropped = 0;
	} else if (rl->refusals_dropped > 0) {
		struct sbx_net_event *ev = push_event(rl->ring, SBX_NET_EV_GUEST_REFUSED, rl->id, 0);
		if (!ev)
			return;
		ev->status = SBX_NET_REFUSAL_DROPPED;
		ev->count = rl->refusals_dropped;
		rl->refusals_dropped = 0;
	}
	struct sbx_net_event *ev = push_event(rl->ring, SBX_NET_EV_GUEST_REFUSED, rl->id, 0);
	if (ev) {
		ev->status = f->value;
		ev->port = f->port;
		ev->count = count;
		memcpy(ev->text, f->data, f->len);
		ev->text[f->len] = '\0';
	}
}

static void on_frame(struct relay *rl, const struct sbx_frame *fr)
{
	struct sbx_net_frame f;
	struct sbx_err why = {0};
	if (sbx_net_decode(fr, &f, &why) < 0) {
		relay_fail(rl, SBX_NET_EV_VIOLATION, "bad frame (type %u, %s)", fr->type, why.msg);
		return;
	}
	if (f.type == SBX_NET_MSG_OPEN) {
		on_open(rl, &f);
		return;
	}
	if (f.type == SBX_NET_MSG_REFUSED) {
		on_refused(rl, &f);
		return;
	}
	struct stream *s = find_stream(rl, f.stream);
	if (!s) {
		/* A frame that crossed our CLOSE or refusal on the wire. */
		if (f.type != SBX_NET_MSG_CONNECTED && is_recent(rl, f.stream))
			return;
		relay_fail(rl, SBX_NET_EV_VIOLATION, "frame type %u for unknown stream %u", f.type,
			   f.stream);
		return;
	}
	if (s->state == S_CLOSING && f.type != SBX_NET_MSG_CLOSE)
		return;
	switch (f.type) {
	case SBX_NET_MSG_CONNECTED: {
		if (s->state != S_CONNECTING) {
			relay_fail(rl, SBX_NET_EV_VIOLATION, "CONNECTED twice on stream %u", s->id);
			return;
		}
		struct sbx_net_event *ev = push_event(rl->ring, SBX_NET_EV_CONNECTED, rl->id, s->id);
		if (ev)
			ev->status = f.value;
		if (f.value != SBX_NET_OK) {
			remember(rl, s->id);
			detach_stream(s);
			return;
		}
		s->state = S_OPEN;
		arm_stream(s);
		return;
	}
	case SBX_NET_MSG_DATA:
		on_data(rl, s, &f);
		return;
	case SBX_NET_MSG_CREDIT:
		if (f.value > s->out_unacked) {
			relay_fail(rl, SBX_NET_EV_VIOLATION, "credit beyond what was sent on stream %u",
				   s->id);
			return;
		}
		s->out_unacked -= f.value;
		arm_stream(s);
		return;
	case SBX_NET_MSG_SHUTDOWN:
		s->guest_shut = 1;
		shut_write_if_drained(s);
		check_done(s);
		return;
	case SBX_NET_MSG_CLOSE:
		on_close(rl, s, &f);
		return;
	default:
		relay_fail(rl, SBX_NET_EV_VIOLATION, "frame type %u from the guest", f.type);
		return;
	}
}

/* Decode and apply every whole frame in bytes the port gave. */
static void consume_port_bytes(struct relay *rl, const uint8_t *data, size_t n)
{
	int err = sbx_reader_feed(&rl->reader, data, n);
	struct sbx_frame fr;
	while (err == 0 && !rl->dead && (err = sbx_reader_next(&rl->reader, &fr)) == 1) {
		on_frame(rl, &fr);
		err = 0;
	}
	if (err < 0 && !rl->dead)
		relay_fail(rl, SBX_NET_EV_VIOLATION, "bad frame header or length");
}

static void on_port_read(struct relay *rl, int res)
{
	if (res <= 0) {
		relay_fail(rl, SBX_NET_EV_PORT_CLOSED, "%s", res == 0 ? "end of file" : strerror(-res));
		return;
	}
	consume_port_bytes(rl, rl->rbuf, (size_t)res);
	if (!rl->dead && submit_op(&rl->read_op) < 0)
		relay_fail(rl, SBX_NET_EV_VIOLATION, "io_uring submission queue full");
}

static void on_port_write(struct relay *rl, int res)
{
	if (res < 0) {
		relay_fail(rl, SBX_NET_EV_PORT_CLOSED, "%s", strerror(-res));
		return;
	}
	rl->fly_off += (size_t)res;
	if (rl->fly_off == rl->outfly.len) {
		rl->outfly.len = 0;
		rl->fly_off = 0;
	}
	flush_port(rl);
}

/* ---- relays ---- */

static struct relay *find_relay(struct sbx_net_ring *r, uint32_t id)
{
	for (struct relay *rl = r->relays; rl; rl = rl->next)
		if (rl->id == id && !rl->forgotten)
			return rl;
	return NULL;
}

static void free_relay(struct relay *rl)
{
	if (rl->fd >= 0)
		close(rl->fd);
	sbx_reader_free(&rl->reader);
	sbx_buf_free(&rl->outq);
	sbx_buf_free(&rl->outfly);
	free(rl->rbuf);
	free(rl);
}

/* Free the streams and relays whose operations have all ended. Called only at the top level
 * (never from a completion handler), so no handler ever holds a pointer to freed memory. */
static void reap(struct sbx_net_ring *r)
{
	for (struct relay **pr = &r->relays; *pr;) {
		struct relay *rl = *pr;
		for (struct stream **ps = &rl->zombies; *ps;) {
			struct stream *s = *ps;
			if (s->recv_op.busy || s->send_op.busy) {
				ps = &s->next;
				continue;
			}
			*ps = s->next;
			free_stream(s);
		}
		if (rl->forgotten && !rl->streams && !rl->zombies && !rl->read_op.busy &&
		    !rl->write_op.busy) {
			*pr = rl->next;
			free_relay(rl);
			continue;
		}
		pr = &rl->next;
	}
}

/* The relay stops for good: every stream's socket is reset, the port is left alone (Python kills
 * the VM). kind SBX_NET_EV_VIOLATION / _PORT_CLOSED reports why; 0 reports nothing. */
static void relay_stop(struct relay *rl, enum sbx_net_event_kind kind, const char *why)
{
	if (rl->dead)
		return;
	rl->dead = 1;
	if (kind) {
		struct sbx_net_event *ev = push_event(rl->ring, kind, rl->id, 0);
		if (ev)
			snprintf(ev->text, sizeof(ev->text), "%s", why);
	}
	while (rl->streams) {
		struct stream *s = rl->streams;
		if (s->state != S_CLOSING) {
			struct sbx_net_event *ev =
				push_event(rl->ring, SBX_NET_EV_CLOSED, rl->id, s->id);
			if (ev) {
				ev->status = SBX_NET_CLOSE_RESET;
				ev->bytes_to_guest = s->to_guest;
				ev->bytes_from_guest = s->from_guest;
			}
		}
		detach_stream(s);
	}
	cancel_op(rl->ring, &rl->read_op);
	cancel_op(rl->ring, &rl->write_op);
}

static void relay_fail(struct relay *rl, enum sbx_net_event_kind kind, const char *fmt, ...)
{
	char why[SBX_NET_NAME_MAX + 1];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	relay_stop(rl, kind, why);
}

static int submit_op(struct op *op)
{
	struct relay *rl;
	struct stream *s = NULL;
	if (op->kind == OP_SOCK_RECV || op->kind == OP_SOCK_SEND) {
		s = op->owner;
		rl = s->relay;
	} else {
		rl = op->owner;
	}
	struct io_uring_sqe *sqe = get_sqe(rl->ring);
	if (!sqe)
		return -EBUSY;
	int fd = s ? s->fd : rl->fd;
	int out = op->kind == OP_PORT_WRITE || op->kind == OP_SOCK_SEND;
	if (op->polling) {
		io_uring_prep_poll_add(sqe, fd, out ? POLLOUT : POLLIN);
	} else {
		switch (op->kind) {
		case OP_PORT_READ:
			if (rl->is_socket)
				io_uring_prep_recv(sqe, fd, rl->rbuf, PORT_READ_CHUNK, 0);
			else
				io_uring_prep_read(sqe, fd, rl->rbuf, PORT_READ_CHUNK, (uint64_t)-1);
			break;
		case OP_PORT_WRITE:
			if (rl->is_socket)
				io_uring_prep_send(sqe, fd, rl->outfly.data + rl->fly_off,
						   rl->outfly.len - rl->fly_off, MSG_NOSIGNAL);
			else
				io_uring_prep_write(sqe, fd, rl->outfly.data + rl->fly_off,
						    (unsigned)(rl->outfly.len - rl->fly_off),
						    (uint64_t)-1);
			break;
		case OP_SOCK_RECV: {
			uint32_t room = SBX_NET_WINDOW - s->out_unacked;
			io_uring_prep_recv(sqe, fd, s->rbuf,
					   room < SBX_NET_DATA_MAX ? room : SBX_NET_DATA_MAX, 0);
			break;
		}
		case OP_SOCK_SEND: {
			uint32_t n = SBX_NET_WINDOW - s->whead;
			if (n > s->wlen)
				n = s->wlen;
			io_uring_prep_send(sqe, fd, s->wring + s->whead, n, MSG_NOSIGNAL);
			break;
		}
		}
	}
	io_uring_sqe_set_data(sqe, op);
	op->busy = 1;
	return 0;
}

static void on_completion(struct op *op, int res)
{
	op->busy = 0;
	struct stream *s = NULL;
	struct relay *rl;
	if (op->kind == OP_SOCK_RECV || op->kind == OP_SOCK_SEND) {
		s = op->owner;
		rl = s->relay;
	} else {
		rl = op->owner;
	}
	int gone = rl->dead || (s && (s->detached || s->state != S_OPEN));
	if (gone || res == -ECANCELED)
		return; /* reap() frees what is left once nothing is busy */
	if (op->polling || res == -EAGAIN || res == -EINTR) {
		/* -EAGAIN (an O_NONBLOCK fd): wait for readiness with a POLL_ADD. After the wait (or
		 * a failed wait), issue the operation itself, which reports any error. */
		op->polling = res == -EAGAIN;
		if (submit_op(op) < 0)
			relay_fail(rl, SBX_NET_EV_VIOLATION, "io_uring submission queue full");
		return;
	}
	switch (op->kind) {
	case OP_PORT_READ:
		on_port_read(rl, res);
		break;
	case OP_PORT_WRITE:
		on_port_write(rl, res);
		break;
	case OP_SOCK_RECV:
		on_recv(s, res);
		break;
	case OP_SOCK_SEND:
		on_send(s, res);
		break;
	}
}

/* ---- public API ---- */

int sbx_net_ring_new(unsigned entries, struct sbx_net_ring **out, struct sbx_err *err)
{
	_cleanup_free_ struct sbx_net_ring *r = calloc(1, sizeof(*r));
	if (!r)
		return sbx_err_set(err, -ENOMEM, "out of memory for the network ring");
	int rc = io_uring_queue_init(entries, &r->uring, 0);
	if (rc < 0)
		return sbx_err_sys(err, rc, "io_uring_queue_init");
	_cleanup_close_ int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (efd < 0)
		rc = sbx_err_sys(err, -errno, "eventfd");
	else if ((rc = io_uring_register_eventfd(&r->uring, efd)) < 0)
		sbx_err_sys(err, rc, "io_uring_register_eventfd");
	if (rc < 0) {
		io_uring_queue_exit(&r->uring);
		return rc;
	}
	r->efd = TAKE_FD(efd);
	*out = TAKE_PTR(r);
	return 0;
}

static void free_stream_list(struct stream *s)
{
	while (s) {
		struct stream *next = s->next;
		free_stream(s);
		s = next;
	}
}

void sbx_net_ring_free(struct sbx_net_ring *r)
{
	if (!r)
		return;
	/* Exiting the ring waits for (or cancels) every operation, so the buffers are free to go. */
	io_uring_queue_exit(&r->uring);
	while (r->relays) {
		struct relay *rl = r->relays;
		r->relays = rl->next;
		free_stream_list(rl->streams);
		free_stream_list(rl->zombies);
		free_relay(rl);
	}
	close(r->efd);
	free(r->evs);
	free(r);
}

int sbx_net_ring_fd(const struct sbx_net_ring *r)
{
	return r->efd;
}

int sbx_net_ring_run(struct sbx_net_ring *r, struct sbx_err *err)
{
	uint64_t counter;
	if (read(r->efd, &counter, sizeof(counter)) < 0 && errno != EAGAIN)
		return sbx_err_sys(err, -errno, "read(eventfd)");
	/* Submitting often completes at once (a send with room in the socket buffer, a recv with
	 * bytes waiting): take those completions in the same call instead of a trip through the
	 * event loop each. Bounded, so that one busy relay cannot hold the loop. */
	for (int round = 0; round < 32; round++) {
		unsigned handled = 0;
		struct io_uring_cqe *cqe;
		while (io_uring_peek_cqe(&r->uring, &cqe) == 0) {
			struct op *op = io_uring_cqe_get_data(cqe);
			int res = cqe->res;
			io_uring_cqe_seen(&r->uring, cqe);
			if (op)
				on_completion(op, res);
			handled++;
		}
		reap(r);
		int submitted = io_uring_submit(&r->uring);
		if (submitted < 0)
			return sbx_err_sys(err, submitted, "io_uring_submit");
		if (handled == 0 && submitted == 0)
			break;
	}
	if (r->error < 0)
		return sbx_err_set(err, r->error, "out of memory for the relay's events");
	return 0;
}

size_t sbx_net_ring_live(const struct sbx_net_ring *r)
{
	size_t n = 0;
	for (const struct relay *rl = r->relays; rl; rl = rl->next) {
		n++;
		for (const struct stream *s = rl->streams; s; s = s->next)
			n++;
		for (const struct stream *s = rl->zombies; s; s = s->next)
			n++;
	}
	return n;
}

int sbx_net_relay_add(struct sbx_net_ring *r, int port_fd, uint32_t *relay, struct sbx_err *err)
{
	struct relay *rl = calloc(1, sizeof(*rl));
	if (!rl)
		return sbx_err_set(err, -ENOMEM, "out of memory for a relay");
	rl->rbuf = malloc(PORT_READ_CHUNK);
	if (!rl->rbuf) {
		free(rl);
		return sbx_err_set(err, -ENOMEM, "out of memory for a relay");
	}
	struct stat st;
	rl->ring = r;
	rl->fd = port_fd;
	/* A socket (the VM's socketpair): recv/send, which io_uring retries on readiness itself
	 * even for an O_NONBLOCK fd, where read/write would come back with -EAGAIN every time. */
	rl->is_socket = fstat(port_fd, &st) == 0 && S_ISSOCK(st.st_mode);
	rl->id = ++r->next_relay_id ? r->next_relay_id : ++r->next_relay_id;
	rl->next_host_id = HOST_STREAM_BIT;
	rl->read_op = (struct op){.kind = OP_PORT_READ, .owner = rl};
	rl->write_op = (struct op){.kind = OP_PORT_WRITE, .owner = rl};
	sbx_reader_init(&rl->reader, SBX_NET_FRAME_MAX);
	if (submit_op(&rl->read_op) < 0) {
		sbx_reader_free(&rl->reader);
		free(rl->rbuf);
		free(rl);
		return sbx_err_set(err, -EBUSY, "the io_uring submission queue is full");
	}
	rl->next = r->relays;
	r->relays = rl;
	*relay = rl->id;
	io_uring_submit(&r->uring);
	return 0;
}

int sbx_net_relay_close(struct sbx_net_ring *r, uint32_t relay, struct sbx_err *err)
{
	struct relay *rl = find_relay(r, relay);
	if (!rl)
		return sbx_err_set(err, -ENOENT, "no relay %u", relay);
	relay_stop(rl, 0, NULL);
	rl->forgotten = 1;
	/* The guest's end may still hold our port fd's peer: shut it so that nothing waits on it. */
	if (rl->fd >= 0)
		shutdown(rl->fd, SHUT_RDWR);
	reap(r);
	io_uring_submit(&r->uring);
	return 0;
}

int sbx_net_open_reply(struct sbx_net_ring *r, uint32_t relay, uint32_t stream, uint32_t status,
		       const char *reason, size_t reason_len, int sock_fd, struct sbx_err *err)
{
	_cleanup_close_ int sock = sock_fd;
	struct relay *rl = find_relay(r, relay);
	struct stream *s = rl && !rl->dead ? find_stream(rl, stream) : NULL;
	if ((status == SBX_NET_OK) != (sock >= 0) || status > SBX_NET_STATUS_MAX)
		return sbx_err_set(err, -EINVAL, "open_reply: a socket with status 0 only, a known "
						 "status otherwise");
	if (!s || s->state != S_OPENING)
		return sbx_err_set(err, -ENOENT, "stream %u of relay %u is gone", stream, relay);
	if (status != SBX_NET_OK) {
		remember(rl, stream);
		detach_stream(s);
		if (queue_opened(rl, stream, status, reason, reason_len) == 0)
			flush_port(rl);
		io_uring_submit(&r->uring);
		return 0;
	}
	s->fd = TAKE_FD(sock);
	s->state = S_OPEN;
	if (queue_opened(rl, stream, SBX_NET_OK, "", 0) == 0) {
		shut_write_if_drained(s);
		arm_stream(s);
		flush_port(rl);
	}
	io_uring_submit(&r->uring);
	return 0;
}

int sbx_net_connect(struct sbx_net_ring *r, uint32_t relay, uint32_t guest_port, int sock_fd,
		    uint32_t *stream, struct sbx_err *err)
{
	_cleanup_close_ int sock = sock_fd;
	struct relay *rl = find_relay(r, relay);
	if (guest_port == 0 || guest_port > 65535 || sock < 0)
		return sbx_err_set(err, -EINVAL, "connect: a socket and a guest port in 1..65535");
	if (!rl || rl->dead)
		return sbx_err_set(err, -ENOENT, "relay %u has ended", relay);
	if (rl->n_streams >= SBX_NET_STREAMS_MAX)
		return sbx_err_set(err, -EBUSY, "the VM has %u streams open", SBX_NET_STREAMS_MAX);
	uint32_t id;
	do {
		id = rl->next_host_id++;
		if (rl->next_host_id == 0)
			rl->next_host_id = HOST_STREAM_BIT;
	} while (find_stream(rl, id) || is_recent(rl, id));
	struct stream *s = new_stream(rl, id, S_CONNECTING, sock);
	if (!s)
		return sbx_err_set(err, -ENOMEM, "out of memory for a stream");
	sock = -1; /* the stream owns it */
	if (queue_u32_frame(rl, SBX_NET_MSG_CONNECT, id, guest_port) == 0)
		flush_port(rl);
	io_uring_submit(&r->uring);
	*stream = id;
	return 0;
}

int sbx_net_relay_ingest(struct sbx_net_ring *r, uint32_t relay, const void *data, size_t n,
			 struct sbx_err *err)
{
	struct relay *rl = find_relay(r, relay);
	if (!rl)
		return sbx_err_set(err, -ENOENT, "no relay %u", relay);
	if (n > PORT_READ_CHUNK)
		return sbx_err_set(err, -EINVAL, "more than one maximal frame (%u bytes)",
				   (unsigned)PORT_READ_CHUNK);
	if (!rl->dead)
		consume_port_bytes(rl, data, n);
	reap(r);
	io_uring_submit(&r->uring);
	return 0;
}
