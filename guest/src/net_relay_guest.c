/* The network relay: see net_relay_guest.h. */
#include "net_relay_guest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "cleanup.h"
#include "net_dns.h"
#include "net_listen.h"
#include "net_routes.h"
#include "net_trust.h"

#define PORT_WAIT_MS 2000u
#define READ_CHUNK (64u * 1024u)
/* virtio_console hands out one page-sized receive buffer per read() and takes at most 32 KiB per
 * write(); it has no read_iter/write_iter, so readv/writev run its read/write once per iovec
 * and go on while each one is filled. Iovecs of those sizes thus move 64 KiB (in) or 256 KiB
 * (out) per syscall instead of 4 KiB or 32 KiB: under TCG every syscall is dear. */
#define PORT_IN_SLICE 4096u
#define PORT_OUT_SLICE (32u * 1024u)
#define PORT_OUT_SLICES 8u
/* Credit back once this much is written (or the socket took everything pending). */
#define CREDIT_BATCH (SBX_NET_WINDOW / 4u)
/* Bytes taken from the port per sbx_net_handle: bounded work per wake-up, and a batch goes to
 * its socket in one send (one wake-up of the reader). A credit batch, not a window: the batch is
 * credited only once sent, and with a whole window per batch the host stopped for every credit
 * round trip (credit-bound 87 % of a download, docs/benchmarks.md). */
#define PORT_READ_BUDGET CREDIT_BATCH
#define SBX_NET_NOFILE 8192u

/* --- state ----------------------------------------------------------------------------------- */

void sbx_net_init(struct sbx_net *n)
{
	memset(n, 0, sizeof(*n));
	n->epfd = n->port_fd = n->dns_fd = -1;
	for (uint32_t i = 0; i < SBX_NET_TABLE_MAX; i++)
		for (uint32_t k = 0; k < SBX_NET_LISTEN_PORTS; k++)
			n->listen_fd[i][k] = -1;
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		n->streams[i].fd = -1;
	for (uint32_t k = 0; k < SBX_NET_CATCHALL_PORTS; k++)
		n->catchall_fd[k] = -1;
	n->next_id = 1;
	sbx_reader_init(&n->reader, SBX_NET_FRAME_MAX);
}

int sbx_net_poll_fd(const struct sbx_net *n)
{
	return n->configured ? n->epfd : -1;
}

/* --- output to the net port ------------------------------------------------------------------ */

static void port_flush(struct sbx_net *n)
{
	while (n->port_fd >= 0 && n->out_off < n->out.len) {
		struct iovec iov[PORT_OUT_SLICES];
		int k = 0;
		for (size_t at = n->out_off; at < n->out.len && k < (int)PORT_OUT_SLICES; k++) {
			size_t len = n->out.len - at < PORT_OUT_SLICE ? n->out.len - at
								       : PORT_OUT_SLICE;
			iov[k] = (struct iovec){.iov_base = n->out.data + at, .iov_len = len};
			at += len;
		}
		ssize_t w = writev(n->port_fd, iov, k);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				sbx_log("net port write: %s", strerror(errno));
			break;
		}
		n->out_off += (size_t)w;
	}
	if (n->out_off == n->out.len) {
		n->out.len = 0;
		n->out_off = 0;
	} else if (n->out_off > n->out.len / 2) {
		sbx_buf_consume(&n->out, n->out_off);
		n->out_off = 0;
	}
}

static size_t out_pending(const struct sbx_net *n)
{
	return n->out.len - n->out_off;
}

/* A frame with an optional u32 and an optional byte run (str when as_str, else raw). */
static void send_frame(struct sbx_net *n, uint8_t type, uint32_t id, const uint32_t *value,
		       const void *data, size_t len, bool as_str)
{
	if (n->broken)
		return;
	size_t start;
	int rc = sbx_frame_begin(&n->out, type, id, &start);
	if (rc == 0 && value)
		rc = sbx_put_u32(&n->out, *value);
	if (rc == 0 && as_str)
		rc = sbx_put_str(&n->out, data, len);
	else if (rc == 0 && len)
		rc = sbx_buf_append(&n->out, data, len);
	if (rc == 0)
		rc = sbx_frame_end(&n->out, start, SBX_NET_FRAME_MAX);
	if (rc < 0) {
		n->out.len = start;
		sbx_log("net frame %u: %s", type, strerror(-rc));
	}
}

static void send_u32(struct sbx_net *n, uint8_t type, uint32_t id, uint32_t v)
{
	send_frame(n, type, id, &v, NULL, 0, false);
}

/* --- streams --------------------------------------------------------------------------------- */

static struct sbx_net_stream *find_stream(struct sbx_net *n, uint32_t id)
{
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		if (n->streams[i].state != SBX_NS_FREE && n->streams[i].id == id)
			return &n->streams[i];
	return NULL;
}

static struct sbx_net_stream *free_slot(struct sbx_net *n)
{
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		if (n->streams[i].state == SBX_NS_FREE)
			return &n->streams[i];
	return NULL;
}

static uint32_t slot_index(const struct sbx_net *n, const struct sbx_net_stream *s)
{
	return (uint32_t)(s - n->streams);
}

/* A stream's epoll tag holds its slot and the slot's generation. The events of one epoll_wait
 * are handled in order, and an earlier one can free a slot and start another stream in it (the
 * host's CLOSE, then a CONNECT or an accept): the old socket's event, already returned, must not
 * reach the new stream. */
_Static_assert(SBX_NET_STREAMS_MAX <= 0x10000u, "a slot index fits in 16 bits of the tag");

static uint64_t stream_tag(const struct sbx_net *n, const struct sbx_net_stream *s)
{
	return sbx_net_tag(SBX_NET_TAG_STREAM, (uint32_t)s->generation << 16 | slot_index(n, s));
}

static struct sbx_net_stream *stream_of_tag(struct sbx_net *n, uint32_t index)
{
	uint32_t slot = index & 0xffffu;
	if (slot >= SBX_NET_STREAMS_MAX || n->streams[slot].generation != index >> 16)
		return NULL;
	return &n->streams[slot];
}

static void stream_start(struct sbx_net *n, struct sbx_net_stream *s, uint32_t id, int fd,
			 enum sbx_net_stream_state state)
{
	/* What the host relays arrives in bursts (a frame, a batch): each should reach the client
	 * at once, not wait behind Nagle for the ACK of the previous one (the host side sets the
	 * same on its sockets). */
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	struct sbx_buf keep = s->pending; /* its allocation is reused */
	uint16_t generation = (uint16_t)(s->generation + 1u);
	memset(s, 0, sizeof(*s));
	s->pending = keep;
	s->generation = generation;
	s->pending.len = 0;
	s->id = id;
	s->fd = fd;
	s->state = state;
	s->send_credit = SBX_NET_WINDOW;
	s->events = 0;
	struct epoll_event ev = {.events = 0, .data.u64 = stream_tag(n, s)};
	if (state == SBX_NS_CONNECTING)
		ev.events = s->events = EPOLLOUT;
	if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		sbx_log("epoll add stream: %s", strerror(errno));
}

/* Close the socket; reset: with an RST (SO_LINGER 0), so that the peer sees a reset, not an EOF. */
static void stream_close_socket(struct sbx_net *n, struct sbx_net_stream *s, bool reset)
{
	if (s->fd < 0)
		return;
	epoll_ctl(n->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	if (reset) {
		struct linger lg = {.l_onoff = 1, .l_linger = 0};
		setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	sbx_close_fd(&s->fd);
	s->events = 0;
}

static void stream_free(struct sbx_net *n, struct sbx_net_stream *s)
{
	stream_close_socket(n, s, true);
	s->state = SBX_NS_FREE;
	s->id = 0;
	s->pending.len = 0;
	s->pending_off = 0;
	if (s->pending.cap > 64u * 1024u)
		sbx_buf_free(&s->pending);
}

/* The stream is over on this side: socket gone, NET_CLOSE sent, waiting for the host's. */
static void stream_end(struct sbx_net *n, struct sbx_net_stream *s, bool reset)
{
	stream_close_socket(n, s, reset);
	s->pending.len = 0;
	s->pending_off = 0;
	if (s->state == SBX_NS_CLOSING)
		return;
	send_u32(n, SBX_NET_MSG_CLOSE, s->id, reset ? SBX_NET_CLOSE_RESET : SBX_NET_CLOSE_DONE);
	s->state = SBX_NS_CLOSING;
}

/* The socket failed (error, reset, the client gone) in whatever state the stream is in. */
static void stream_fail(struct sbx_net *n, struct sbx_net_stream *s)
{
	switch (s->state) {
	case SBX_NS_OPENING:
		/* NET_OPENED is still to come: it decides between freeing and NET_CLOSE. */
		stream_close_socket(n, s, true);
		s->sock_failed = true;
		break;
	case SBX_NS_CONNECTING:
		send_u32(n, SBX_NET_MSG_CONNECTED, s->id, SBX_NET_CONNECT_FAILED);
		stream_free(n, s);
		break;
	case SBX_NS_OPEN:
		stream_end(n, s, true);
		break;
	case SBX_NS_FREE:
	case SBX_NS_CLOSING:
		break;
	}
}

/* Both directions finished and everything written: a clean end. */
static void stream_check_done(struct sbx_net *n, struct sbx_net_stream *s)
{
	if (s->state == SBX_NS_OPEN && s->eof_sent && s->wr_shut)
		stream_end(n, s, false);
}

static void stream_credit(struct sbx_net *n, struct sbx_net_stream *s, bool force)
{
	if (s->to_credit && (force || s->to_credit >= CREDIT_BATCH)) {
		send_u32(n, SBX_NET_MSG_CREDIT, s->id, s->to_credit);
		s->recv_inflight -= s->to_credit;
		s->to_credit = 0;
	}
}

/* Write what is pending to the socket; then the half close if the host asked for it. */
static void stream_drain(struct sbx_net *n, struct sbx_net_stream *s)
{
	while (s->fd >= 0 && s->pending_off < s->pending.len) {
		ssize_t w = send(s->fd, s->pending.data + s->pending_off,
				 s->pending.len - s->pending_off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			stream_fail(n, s);
			return;
		}
		s->pending_off += (size_t)w;
		s->to_credit += (uint32_t)w;
	}
	bool empty = s->pending_off == s->pending.len;
	if (empty) {
		s->pending.len = 0;
		s->pending_off = 0;
	}
	stream_credit(n, s, empty);
	if (empty && s->host_shut && !s->wr_shut && s->fd >= 0) {
		shutdown(s->fd, SHUT_WR);
		s->wr_shut = true;
		stream_check_done(n, s);
	}
}

/* One read from the socket into a NET_DATA frame, within the host's credit. Returns true when
 * the read filled its frame (more may be waiting). */
static bool stream_read_frame(struct sbx_net *n, struct sbx_net_stream *s)
{
	uint32_t want = s->send_credit < SBX_NET_DATA_MAX ? s->send_credit : SBX_NET_DATA_MAX;
	if (want == 0 || s->eof_sent || s->fd < 0)
		return false;
	size_t start;
	if (sbx_frame_begin(&n->out, SBX_NET_MSG_DATA, s->id, &start) < 0 ||
	    sbx_buf_reserve(&n->out, want) < 0) {
		/* Out of memory. Left as it is, a hung-up socket (its EPOLLHUP cannot be masked)
		 * would wake the loop without end: the stream is reset instead. */
		n->out.len = start;
		sbx_log("net stream %u: no memory for a frame: reset", s->id);
		stream_fail(n, s);
		return false;
	}
	ssize_t r;
	do
		r = recv(s->fd, n->out.data + n->out.len, want, MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r > 0) {
		n->out.len += (size_t)r;
		sbx_frame_end(&n->out, start, SBX_NET_FRAME_MAX);
		s->send_credit -= (uint32_t)r;
		return (uint32_t)r == want;
	}
	n->out.len = start;
	if (r == 0) {
		send_frame(n, SBX_NET_MSG_SHUTDOWN, s->id, NULL, NULL, 0, false);
		s->eof_sent = true;
		stream_check_done(n, s);
	} else if (errno != EAGAIN) {
		stream_fail(n, s);
	}
	return false;
}

/* Frames read per stream and loop turn, at most. The first comes with the socket's event, on the
 * terms of its epoll mask (set at the end of the last turn, while the port was under its high
 * water), whatever the port holds now: it is what keeps every ready stream moving, whatever its
 * place in the turn (stream_on_event). The rest (stream_read_more) go round the streams whose
 * last read filled its frame, one frame each per pass, while the port is under its high water:
 * one stream never takes the port's room from the others, and one port flush per turn carries
 * them all.
 * A client that sends has often written several frames by the agent's turn (the agent was busy
 * with the port, or the client ran on), and one read per event measured 25-35 % slower on upload
 * (bench/network.py, docs/benchmarks.md): every 60 KiB paid a turn of the agent's loop and a
 * port flush of its own. */
#define READS_PER_TURN 8

static void stream_read(struct sbx_net *n, struct sbx_net_stream *s)
{
	s->read_full = stream_read_frame(n, s);
}

static void stream_read_more(struct sbx_net *n)
{
	uint32_t first = n->read_from;
	for (int pass = 1; pass < READS_PER_TURN; pass++) {
		bool more = false;
		for (uint32_t k = 0; k < SBX_NET_STREAMS_MAX; k++) {
			uint32_t slot = (first + k) % SBX_NET_STREAMS_MAX;
			struct sbx_net_stream *s = &n->streams[slot];
			if (!s->read_full)
				continue;
			if (out_pending(n) >= SBX_NET_OUT_HIGH_WATER)
				goto done;
			/* The next turn starts after the last stream served: when the high water
			 * cuts a pass short, the streams it did not reach go first. */
			n->read_from = (slot + 1) % SBX_NET_STREAMS_MAX;
			s->read_full = s->state == SBX_NS_OPEN && stream_read_frame(n, s);
			more |= s->read_full;
		}
		if (!more)
			break;
	}
done:
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		n->streams[i].read_full = false;
}

/* The epoll mask a stream needs now; applied only when it changes. */
static void stream_update_events(struct sbx_net *n, struct sbx_net_stream *s)
{
	if (s->fd < 0)
		return;
	uint32_t ev = 0;
	if (s->state == SBX_NS_CONNECTING || s->pending_off < s->pending.len)
		ev |= EPOLLOUT;
	if (s->state == SBX_NS_OPEN && !s->eof_sent && s->send_credit > 0 &&
	    out_pending(n) < SBX_NET_OUT_HIGH_WATER)
		ev |= EPOLLIN;
	struct epoll_event e = {.events = ev, .data.u64 = stream_tag(n, s)};
	if (s->parked) {
		if (ev && epoll_ctl(n->epfd, EPOLL_CTL_ADD, s->fd, &e) == 0) {
			s->parked = false;
			s->events = ev;
		}
		return;
	}
	if (ev == s->events)
		return;
	if (epoll_ctl(n->epfd, EPOLL_CTL_MOD, s->fd, &e) == 0)
		s->events = ev;
}

static void stream_park(struct sbx_net *n, struct sbx_net_stream *s)
{
	if (epoll_ctl(n->epfd, EPOLL_CTL_DEL, s->fd, NULL) == 0) {
		s->parked = true;
		s->events = 0;
	}
}

static void stream_on_event(struct sbx_net *n, struct sbx_net_stream *s, uint32_t ev)
{
	if (s->fd < 0)
		return;
	if (s->state == SBX_NS_CONNECTING) {
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err || (ev & EPOLLERR)) {
			stream_fail(n, s);
			return;
		}
		send_u32(n, SBX_NET_MSG_CONNECTED, s->id, SBX_NET_OK);
		s->state = SBX_NS_OPEN;
		return;
	}
	if (s->state == SBX_NS_OPENING) {
		/* Nothing is read before NET_OPENED; only a failure can be reported (epoll reports
		 * EPOLLERR and EPOLLHUP whatever the mask). */
		if (ev & (EPOLLERR | EPOLLHUP))
			stream_fail(n, s);
		return;
	}
	if (s->state != SBX_NS_OPEN)
		return;
	if (ev & EPOLLERR) {
		stream_fail(n, s);
		return;
	}
	if (ev & EPOLLOUT)
		stream_drain(n, s);
	if (s->fd < 0 || s->state != SBX_NS_OPEN)
		return;
	/* EPOLLIN is in the mask only while the port is under its high water (so output grows at
	 * most a frame per ready socket past it in a turn). EPOLLHUP cannot be masked: a hung-up
	 * socket is read on the same terms, while its mask in force has EPOLLIN (a test of the
	 * port's fill now would let the streams ahead of it in the turn keep it out), and parked
	 * otherwise, or it would wake every wait. */
	bool hup_room = !(ev & EPOLLHUP) || (s->events & EPOLLIN);
	if ((ev & (EPOLLIN | EPOLLHUP)) && hup_room && !s->eof_sent && s->send_credit > 0)
		stream_read(n, s); /* what is left in the receive buffer, then EOF */
	else if (ev & EPOLLHUP)
		stream_park(n, s); /* back in once the port drains, or with credit or data to write */
}

/* --- frames from the host -------------------------------------------------------------------- */

static void host_data(struct sbx_net *n, struct sbx_net_stream *s,
		      const struct sbx_net_host_msg *m)
{
	if (s->state == SBX_NS_CLOSING)
		return; /* sent before it saw our NET_CLOSE */
	if (s->state != SBX_NS_OPEN || s->host_shut ||
	    m->len > SBX_NET_WINDOW - s->recv_inflight) {
		/* Data before the stream is open, after the host's half close, or past the window:
		 * the host broke the stream's contract. It costs the stream, not the VM. */
		sbx_log("net stream %u: DATA out of contract (%u bytes, %u in flight): reset",
			s->id, m->len, s->recv_inflight);
		stream_end(n, s, true);
		return;
	}
	s->recv_inflight += m->len;
	if (sbx_buf_append(&s->pending, m->data, m->len) < 0) {
		stream_end(n, s, true);
		return;
	}
	/* Written once the port read is done (port_read): every DATA of the batch in one send,
	 * which wakes the client once instead of once per frame. */
	s->drain_due = true;
}

static void host_opened(struct sbx_net *n, struct sbx_net_stream *s,
			const struct sbx_net_host_msg *m)
{
	if (s->state != SBX_NS_OPENING) {
		sbx_log("net stream %u: unexpected OPENED", s->id);
		return;
	}
	if (m->value != SBX_NET_OK) {
		/* Refused: the client sees a reset. No NET_CLOSE follows a failed open. */
		stream_free(n, s);
		return;
	}
	s->state = SBX_NS_OPEN;
	if (s->sock_failed)
		stream_end(n, s, true);
}

static void host_connect(struct sbx_net *n, const struct sbx_net_host_msg *m)
{
	if (find_stream(n, m->id)) {
		sbx_log("net: CONNECT for live stream %u ignored", m->id);
		return;
	}
	struct sbx_net_stream *s = free_slot(n);
	if (!s) {
		send_u32(n, SBX_NET_MSG_CONNECTED, m->id, SBX_NET_TOO_MANY);
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		send_u32(n, SBX_NET_MSG_CONNECTED, m->id, SBX_NET_CONNECT_FAILED);
		return;
	}
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)m->value),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		close(fd);
		send_u32(n, SBX_NET_MSG_CONNECTED, m->id, SBX_NET_CONNECT_FAILED);
		return;
	}
	/* Even a connect that completed at once is reported from the event loop (EPOLLOUT). */
	stream_start(n, s, m->id, fd, SBX_NS_CONNECTING);
}

static void host_frame(struct sbx_net *n, const struct sbx_frame *f)
{
	struct sbx_net_host_msg m;
	const char *why = "?";
	if (sbx_net_parse_host_frame(f, &m, &why) < 0) {
		sbx_log("net port: bad frame type %u id %u: %s", f->type, f->id, why);
		return;
	}
	if (m.type == SBX_NET_MSG_CONNECT) {
		host_connect(n, &m);
		return;
	}
	struct sbx_net_stream *s = find_stream(n, m.id);
	if (!s) {
		/* A late frame for a stream this side has freed (the host's CLOSE crossed ours). */
		return;
	}
	switch (m.type) {
	case SBX_NET_MSG_OPENED:
		host_opened(n, s, &m);
		break;
	case SBX_NET_MSG_DATA:
		host_data(n, s, &m);
		break;
	case SBX_NET_MSG_CREDIT:
		if (s->state != SBX_NS_OPEN)
			break;
		if (m.value > SBX_NET_WINDOW - s->send_credit) {
			sbx_log("net stream %u: CREDIT past the window: reset", s->id);
			stream_end(n, s, true);
			break;
		}
		s->send_credit += m.value;
		break;
	case SBX_NET_MSG_SHUTDOWN:
		if (s->state != SBX_NS_OPEN)
			break;
		s->host_shut = true;
		stream_drain(n, s);
		break;
	case SBX_NET_MSG_CLOSE:
		/* Answer unless ours was already sent; either way the id is free now. */
		if (s->state == SBX_NS_OPEN)
			send_u32(n, SBX_NET_MSG_CLOSE, s->id, m.value);
		stream_free(n, s);
		break;
	default:
		break;
	}
}

/* The host broke the framing, or closed its end: the port is done. Every stream is reset, queued
 * output dropped, and from now on connections to the listeners are reset at once (send_frame
 * drops everything), so that nothing piles up for a port nobody reads. */
static void port_broken(struct sbx_net *n, int rc)
{
	sbx_log("net port: %s: closing every stream", strerror(-rc));
	n->broken = true;
	n->out.len = 0;
	n->out_off = 0;
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		if (n->streams[i].state != SBX_NS_FREE)
			stream_free(n, &n->streams[i]);
	epoll_ctl(n->epfd, EPOLL_CTL_DEL, n->port_fd, NULL);
	n->port_events = 0;
}

static void port_read_batch(struct sbx_net *n)
{
	for (size_t total = 0; total < PORT_READ_BUDGET && !n->broken;) {
		/* Straight into the frame reader: no copy between the port and the decoder. */
		uint8_t *at;
		int rc = sbx_reader_space(&n->reader, READ_CHUNK, &at);
		if (rc < 0) {
			port_broken(n, rc);
			return;
		}
		/* The last read of a turn takes only the pages the budget has left: a turn ends
		 * within a page of it. */
		size_t left = PORT_READ_BUDGET - total;
		size_t slices = left < READ_CHUNK ? (left + PORT_IN_SLICE - 1) / PORT_IN_SLICE
						  : READ_CHUNK / PORT_IN_SLICE;
		struct iovec iov[READ_CHUNK / PORT_IN_SLICE];
		for (size_t i = 0; i < slices; i++)
			iov[i] = (struct iovec){.iov_base = at + i * PORT_IN_SLICE,
						.iov_len = PORT_IN_SLICE};
		ssize_t r = readv(n->port_fd, iov, (int)slices);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return; /* EAGAIN */
		if (r == 0) {
			/* The host end closed (QEMU's chardev socket: it never reopens). Its
			 * EPOLLHUP would wake the loop without end: the port is done. */
			port_broken(n, -ECONNRESET);
			return;
		}
		total += (size_t)r;
		sbx_reader_commit(&n->reader, (size_t)r);
		struct sbx_frame f;
		while (rc >= 0 && (rc = sbx_reader_next(&n->reader, &f)) == 1)
			host_frame(n, &f);
		if (rc < 0) {
			port_broken(n, rc);
			return;
		}
	}
}

static void port_read(struct sbx_net *n)
{
	port_read_batch(n);
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++) {
		struct sbx_net_stream *s = &n->streams[i];
		if (s->drain_due) {
			s->drain_due = false;
			if (s->state == SBX_NS_OPEN)
				stream_drain(n, s);
		}
	}
}

/* --- guest streams: connections the listeners accepted --------------------------------------- */

static uint32_t new_guest_id(struct sbx_net *n)
{
	for (;;) {
		uint32_t id = n->next_id;
		n->next_id = id >= 0x7fffffffu ? 1 : id + 1;
		if (!find_stream(n, id))
			return id;
	}
}

int sbx_net_stream_open(struct sbx_net *n, int fd, uint32_t port, const char *name,
			size_t name_len)
{
	struct sbx_net_stream *s = n->broken ? NULL : free_slot(n);
	if (!s)
		return n->broken ? -EPIPE : -EAGAIN;
	uint32_t id = new_guest_id(n);
	send_frame(n, SBX_NET_MSG_OPEN, id, &port, name, name_len, true);
	stream_start(n, s, id, fd, SBX_NS_OPENING);
	return 0;
}

/* --- refusals for the host's log ------------------------------------------------------------- */

/* Reports wait behind this much unsent port output at most: they never hold up the streams. */
#define REPORT_OUT_MAX (64u * 1024u)

static void send_refused(struct sbx_net *n, uint32_t what, uint32_t port, uint32_t count,
			 const char *subject, size_t len)
{
	uint32_t head[3] = {what, port, count};
	size_t start;
	int rc = sbx_frame_begin(&n->out, SBX_NET_MSG_REFUSED, 0, &start);
	for (size_t i = 0; rc == 0 && i < 3; i++)
		rc = sbx_put_u32(&n->out, head[i]);
	if (rc == 0)
		rc = sbx_put_str(&n->out, subject, len);
	if (rc == 0)
		rc = sbx_frame_end(&n->out, start, SBX_NET_FRAME_MAX);
	if (rc < 0)
		n->out.len = start;
}

void sbx_net_report_refusal(struct sbx_net *n, uint32_t what, uint32_t port, const char *subject,
			    size_t len)
{
	struct sbx_refusal_reports *r = &n->reports;
	const uint64_t period = 1000000000u / SBX_NET_REPORTS_PER_SECOND;
	uint64_t now = sbx_now_ns();
	/* FNV-1a over what, port and subject: enough to tell repeats apart. */
	uint64_t hash = 1469598103934665603u ^ what ^ ((uint64_t)port << 8);
	for (size_t i = 0; i < len; i++)
		hash = (hash ^ (uint8_t)subject[i]) * 1099511628211u;
	for (uint32_t i = 0; i < SBX_NET_REPORTS_RECENT; i++)
		if (r->recent[i].hash == hash && now - r->recent[i].at_ns < 1000000000u)
			return; /* the same attempt again: one entry says it */
	r->recent[r->recent_pos].hash = hash;
	r->recent[r->recent_pos].at_ns = now;
	r->recent_pos = (r->recent_pos + 1) % SBX_NET_REPORTS_RECENT;
	if (r->refill_ns == 0) {
		r->tokens = SBX_NET_REPORTS_BURST;
		r->refill_ns = now;
	} else if (now - r->refill_ns >= period) {
		uint64_t add = (now - r->refill_ns) / period;
		r->tokens = (uint32_t)(add >= SBX_NET_REPORTS_BURST - r->tokens ? SBX_NET_REPORTS_BURST
										 : r->tokens + add);
		r->refill_ns += add * period;
	}
	if (n->broken || r->tokens == 0 || out_pending(n) > REPORT_OUT_MAX) {
		r->dropped++;
		return;
	}
	r->tokens--;
	if (r->dropped > 0) {
		send_refused(n, SBX_NET_REFUSAL_DROPPED, 0,
			     (uint32_t)(r->dropped > SBX_NET_REFUSAL_COUNT_MAX
						? SBX_NET_REFUSAL_COUNT_MAX
						: r->dropped),
			     "", 0);
		r->dropped = 0;
	}
	send_refused(n, what, port, 1, subject, len);
	port_flush(n);
}

/* --- configuration --------------------------------------------------------------------------- */

__attribute__((format(printf, 4, 5))) static int refuse(char *msg, size_t cap, int rc,
							 const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, cap, fmt, ap);
	va_end(ap);
	return rc;
}

/* A VM restored from a state saved with network (REATTACH): the streams' host ends died with the
 * old host, the bytes queued for it and a frame half read from it mean nothing to the new one.
 * Every stream is reset (guest programs see a reset), the port's queues emptied, and the new
 * configuration taken. The name table and its listeners stay (a program's cached DNS answer
 * still reaches its name), so the outbound flag and the extra ports must be the ones they were
 * made for; the names and the CA bundle may change. The net port is the same device. */
static int reattach(struct sbx_net *n, const uint8_t *payload, size_t len,
		    const struct sbx_net_config *probe, char *msg, size_t cap)
{
	bool same = (probe->flags & SBX_NET_CONFIG_OUTBOUND) ==
			    (n->cfg.flags & SBX_NET_CONFIG_OUTBOUND) &&
		    probe->port_count == n->cfg.port_count;
	for (uint32_t k = 0; same && k < probe->port_count; k++)
		same = probe->ports[k] == n->cfg.ports[k];
	if (!same)
		return refuse(msg, cap, -EPROTO,
			      "NET_CONFIG: reattach with another outbound flag or ports");
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return refuse(msg, cap, -ENOMEM, "NET_CONFIG: out of memory");
	memcpy(buf, payload, len);
	const char *why = "?";
	int rc;
	if (probe->ca_bundle && (rc = sbx_net_install_ca(probe->ca_bundle, probe->ca_len)) < 0) {
		free(buf);
		return refuse(msg, cap, rc, "NET_CONFIG: CA bundle: %s", strerror(-rc));
	}
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		if (n->streams[i].state != SBX_NS_FREE)
			stream_free(n, &n->streams[i]);
	n->out.len = 0;
	n->out_off = 0;
	if (sbx_buf_append(&n->out, SBX_NET_REATTACH_MARK, SBX_NET_REATTACH_MARK_LEN) < 0) {
		free(buf);
		return refuse(msg, cap, -ENOMEM, "NET_CONFIG: out of memory");
	}
	sbx_reader_free(&n->reader);
	sbx_reader_init(&n->reader, SBX_NET_FRAME_MAX);
	n->broken = false;
	memset(&n->reports, 0, sizeof(n->reports));
	free(n->cfg_buf);
	n->cfg_buf = buf;
	sbx_net_parse_config(buf, len, &n->cfg, &why); /* the same bytes: cannot fail now */
	if (n->port_events == 0) { /* a broken port left the set: read the new host */
		struct epoll_event ev = {.events = EPOLLIN,
					 .data.u64 = sbx_net_tag(SBX_NET_TAG_PORT, 0)};
		if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->port_fd, &ev) == 0)
			n->port_events = EPOLLIN;
	}
	port_flush(n);
	return 0;
}

int sbx_net_configure(struct sbx_net *n, const uint8_t *payload, size_t len, int port_fd,
		      bool test_mode, bool own_net_ns, char *msg, size_t cap)
{
	struct sbx_net_config probe;
	const char *why = "?";
	int rc = sbx_net_parse_config(payload, len, &probe, &why);
	if (rc < 0)
		return refuse(msg, cap, rc, "bad NET_CONFIG: %s", why);
	if (n->configured && !(probe.flags & SBX_NET_CONFIG_REATTACH))
		return refuse(msg, cap, -EALREADY, "NET_CONFIG: already configured");
	if (n->configured)
		return reattach(n, payload, len, &probe, msg, cap);
	if (port_fd < 0 && test_mode)
		return refuse(msg, cap, -ENODEV, "NET_CONFIG: no network port (test mode)");
	/* A test agent on the host (no --boot namespaces) must not add addresses to the host's lo
	 * nor bind its port 53: outbound is the VM's (or a namespaced test's). */
	if (test_mode && !own_net_ns && (probe.flags & SBX_NET_CONFIG_OUTBOUND))
		return refuse(msg, cap, -EPERM,
			      "NET_CONFIG: outbound needs the VM's network namespace");
	/* The caller keeps its fd (test mode): the net module works on its own copy. */
	_cleanup_close_ int port = port_fd >= 0 ? fcntl(port_fd, F_DUPFD_CLOEXEC, 3) : -1;
	if (port_fd >= 0 && port < 0)
		return refuse(msg, cap, -errno, "NET_CONFIG: dup: %s", strerror(errno));
	if (port < 0 && (rc = sbx_channel_find_port(SBX_NET_PORT_NAME, PORT_WAIT_MS, &port)) < 0)
		return refuse(msg, cap, rc, "NET_CONFIG: no port %s: %s", SBX_NET_PORT_NAME,
			      strerror(-rc));
	int fl = fcntl(port, F_GETFL);
	if (fl < 0 || fcntl(port, F_SETFL, fl | O_NONBLOCK) < 0)
		return refuse(msg, cap, -errno, "NET_CONFIG: net port: %s", strerror(errno));
	_cleanup_free_ uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return refuse(msg, cap, -ENOMEM, "NET_CONFIG: out of memory");
	memcpy(buf, payload, len);
	sbx_net_parse_config(buf, len, &n->cfg, &why); /* the same bytes: cannot fail now */
	if (n->cfg.ca_bundle && (rc = sbx_net_install_ca(n->cfg.ca_bundle, n->cfg.ca_len)) < 0)
		return refuse(msg, cap, rc, "NET_CONFIG: CA bundle: %s", strerror(-rc));
	n->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (n->epfd < 0)
		return refuse(msg, cap, -errno, "NET_CONFIG: epoll: %s", strerror(errno));
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = sbx_net_tag(SBX_NET_TAG_PORT, 0)};
	if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, port, &ev) < 0) {
		rc = -errno;
		sbx_close_fd(&n->epfd);
		return refuse(msg, cap, rc, "NET_CONFIG: epoll: %s", strerror(-rc));
	}
	n->port_events = EPOLLIN;
	/* Every name with an address holds a listener per port (up to 128 x 18) besides the
	 * streams: more than PID 1's default 1024 fds. User code has its own limit (spawn.c). */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < SBX_NET_NOFILE) {
		struct rlimit want = {SBX_NET_NOFILE,
				      rl.rlim_max > SBX_NET_NOFILE ? rl.rlim_max : SBX_NET_NOFILE};
		if (setrlimit(RLIMIT_NOFILE, &want) < 0) {
			want.rlim_cur = rl.rlim_max;
			want.rlim_max = rl.rlim_max;
			/* test mode without privilege: what there is */
			setrlimit(RLIMIT_NOFILE, &want);
		}
	}
	if (n->cfg.flags & SBX_NET_CONFIG_OUTBOUND) {
		if ((rc = sbx_net_add_synthetic_range()) < 0 || (rc = sbx_net_dns_open(n)) < 0) {
			sbx_close_fd(&n->epfd);
			return refuse(msg, cap, rc, "NET_CONFIG: outbound setup: %s",
				      strerror(-rc));
		}
		/* Without these an IP literal or an unassigned synthetic address fails inside the
		 * guest unseen; with them it is reset all the same, and reported to the host's log.
		 * Best effort: without them the VM's network works as before. */
		if ((rc = sbx_net_route_everything_local()) < 0)
			sbx_log("net: local default route: %s", strerror(-rc));
		else
			sbx_net_catchall_open(n);
	}
	n->port_fd = TAKE_FD(port);
	n->cfg_buf = TAKE_PTR(buf);
	n->configured = true;
	/* A REATTACH the first time: nothing is stale, but the host waits for the mark all the same. */
	if ((probe.flags & SBX_NET_CONFIG_REATTACH) &&
	    sbx_buf_append(&n->out, SBX_NET_REATTACH_MARK, SBX_NET_REATTACH_MARK_LEN) == 0)
		port_flush(n);
	return 0;
}

/* --- the loop -------------------------------------------------------------------------------- */

void sbx_net_handle(struct sbx_net *n)
{
	if (!n->configured)
		return;
	struct epoll_event evs[32];
	int k = epoll_wait(n->epfd, evs, 32, 0);
	for (int i = 0; i < k; i++) {
		uint32_t index = (uint32_t)evs[i].data.u64;
		switch ((enum sbx_net_tag)(evs[i].data.u64 >> 32)) {
		case SBX_NET_TAG_PORT:
			if (evs[i].events & EPOLLOUT)
				port_flush(n);
			if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
				port_read(n);
			break;
		case SBX_NET_TAG_DNS:
			sbx_net_dns_serve(n);
			break;
		case SBX_NET_TAG_LISTENER:
			sbx_net_listen_accept(n, index);
			break;
		case SBX_NET_TAG_CATCHALL:
			sbx_net_catchall_accept(n, index);
			break;
		case SBX_NET_TAG_STREAM: {
			struct sbx_net_stream *s = stream_of_tag(n, index);
			if (s)
				stream_on_event(n, s, evs[i].events);
			break;
		}
		}
	}
	stream_read_more(n);
	port_flush(n);
	for (uint32_t i = 0; i < SBX_NET_STREAMS_MAX; i++)
		if (n->streams[i].state != SBX_NS_FREE)
			stream_update_events(n, &n->streams[i]);
	/* The port: readable unless broken; writable interest only while output waits. A port
	 * whose host end is closed reports EPOLLHUP without end: leave it out then. */
	uint32_t pev = n->broken ? 0 : EPOLLIN;
	if (out_pending(n) && !n->broken)
		pev |= EPOLLOUT;
	if (pev != n->port_events) {
		struct epoll_event e = {.events = pev,
					 .data.u64 = sbx_net_tag(SBX_NET_TAG_PORT, 0)};
		int op = n->port_events == 0 ? EPOLL_CTL_ADD
			 : pev == 0          ? EPOLL_CTL_DEL
					     : EPOLL_CTL_MOD;
		if (epoll_ctl(n->epfd, op, n->port_fd, &e) == 0)
			n->port_events = pev;
	}
}
