/* The network relay (net_relay.c) against a stand-in guest: the test plays the guest agent on one
 * end of a socketpair (the NET port), and the host's TCP peers on other socketpairs. A real
 * io_uring drives it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "net_wire.h"
#include "net_relay.h"
#include "test.h"

struct guest {
	int fd;
	struct sbx_reader in;
	uint8_t buf[128 * 1024];
};

static struct sbx_net_ring *ring;
/* Where a call's error goes when the test does not look at its explanation. */
static struct sbx_err E;

/* Run the ring until it has nothing more to do for a while (its work here is local socketpairs:
 * a few milliseconds of quiet mean it is done). */
static void pump(void)
{
	for (int i = 0; i < 50; i++) {
		struct pollfd p = {sbx_net_ring_fd(ring), POLLIN, 0};
		if (poll(&p, 1, 5) <= 0 && i > 1)
			return;
		CHECK_EQ(sbx_net_ring_run(ring, &E), 0);
	}
}

static int next_event(struct sbx_net_event *ev)
{
	pump();
	return sbx_net_ring_next_event(ring, ev);
}

static void guest_send(struct guest *g, uint8_t type, uint32_t id, const void *payload, size_t n)
{
	struct sbx_buf b = {0};
	size_t start;
	sbx_frame_begin(&b, type, id, &start);
	if (n)
		sbx_buf_append(&b, payload, n);
	CHECK_EQ(sbx_frame_end(&b, start, 1u << 20), 0);
	/* A window's worth is more than the socketpair holds: let the relay read while it fills. */
	size_t off = 0;
	for (int stuck = 0; off < b.len && stuck < 100;) {
		ssize_t w = send(g->fd, b.data + off, b.len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			off += (size_t)w;
			stuck = 0;
			continue;
		}
		stuck++;
		pump();
	}
	CHECK_EQ(off, b.len);
	sbx_buf_free(&b);
}

static void guest_u32(struct guest *g, uint8_t type, uint32_t id, uint32_t v)
{
	uint8_t p[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
	guest_send(g, type, id, p, 4);
}

static void guest_open(struct guest *g, uint32_t id, const char *name, uint32_t port)
{
	struct sbx_buf b = {0};
	sbx_put_u32(&b, port);
	sbx_put_str(&b, name, strlen(name));
	guest_send(g, SBX_NET_MSG_OPEN, id, b.data, b.len);
	sbx_buf_free(&b);
}

/* The next frame the host sent the guest (copied into out, payload <= cap); 0 if none came
 * within ~10 quiet rounds of pumping (the "nothing more" answer most loops end on). */
static int guest_recv(struct guest *g, struct sbx_frame *f, uint8_t *out, size_t cap)
{
	for (int i = 0, quiet = 0; i < 100 && quiet < 10; i++) {
		struct sbx_frame fr;
		int rc = sbx_reader_next(&g->in, &fr);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			*f = fr;
			size_t n = fr.payload_len < cap ? fr.payload_len : cap;
			memcpy(out, fr.payload, n);
			f->payload = out;
			return 1;
		}
		pump();
		struct pollfd p = {g->fd, POLLIN, 0};
		if (poll(&p, 1, 20) > 0) {
			ssize_t n = read(g->fd, g->buf, sizeof(g->buf));
			if (n <= 0)
				return 0;
			sbx_reader_feed(&g->in, g->buf, (size_t)n);
			quiet = 0;
		} else {
			quiet++;
		}
	}
	return 0;
}

static uint32_t u32_at(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t start(struct guest *g)
{
	int sv[2];
	uint32_t relay = 0;
	CHECK_EQ(sbx_net_ring_new(256, &ring, &E), 0);
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	g->fd = sv[1];
	sbx_reader_init(&g->in, 1u << 20);
	CHECK_EQ(sbx_net_relay_add(ring, sv[0], &relay, &E), 0);
	CHECK(relay != 0);
	return relay;
}

static void stop(struct guest *g)
{
	close(g->fd);
	sbx_reader_free(&g->in);
	sbx_net_ring_free(ring);
	ring = NULL;
}

/* A peer socket for a stream: returns the host's end (for the relay), *peer the test's end. */
static int peer_pair(int *peer)
{
	int sv[2];
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	*peer = sv[1];
	return sv[0];
}

static ssize_t peer_read(int fd, void *buf, size_t n)
{
	for (int i = 0; i < 100; i++) {
		pump();
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 20) > 0)
			return read(fd, buf, n);
	}
	return -1;
}

static void test_open_is_an_event_and_bytes_flow_both_ways(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	struct sbx_frame f;
	uint8_t buf[70000];
	int peer;

	guest_open(&g, 7, "api.example.org", 443);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(ev.kind, SBX_NET_EV_OPEN);
	CHECK_EQ(ev.stream, 7);
	CHECK_EQ(ev.port, 443);
	CHECK_STR(ev.text, "api.example.org");
	/* Bytes the guest sends before OPENED are kept (within the window) and delivered. */
	guest_send(&g, SBX_NET_MSG_DATA, 7, "early ", 6);
	pump();
	CHECK_EQ(sbx_net_open_reply(ring, relay, 7, SBX_NET_OK, NULL, 0, peer_pair(&peer), &E), 0);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_OPENED);
	CHECK_EQ(u32_at(f.payload), SBX_NET_OK);
	guest_send(&g, SBX_NET_MSG_DATA, 7, "hello", 5);
	char got[64] = {0};
	size_t have = 0;
	while (have < 11) {
		ssize_t n = peer_read(peer, got + have, sizeof(got) - 1 - have);
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	CHECK_STR(got, "early hello");
	/* The relay credits what it wrote to the socket. */
	uint32_t credited = 0;
	while (credited < 11 && guest_recv(&g, &f, buf, sizeof(buf)) == 1) {
		CHECK_EQ(f.type, SBX_NET_MSG_CREDIT);
		CHECK_EQ(f.id, 7);
		credited += u32_at(f.payload);
	}
	CHECK_EQ(credited, 11);
	/* Peer -> guest. */
	CHECK_EQ(write(peer, "world", 5), 5);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_DATA);
	CHECK_EQ(f.payload_len, 5);
	CHECK(memcmp(f.payload, "world", 5) == 0);
	/* The peer closes: SHUTDOWN to the guest; the guest shuts too: EOF at the peer, CLOSE. */
	shutdown(peer, SHUT_WR);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_SHUTDOWN);
	CHECK_EQ(f.payload_len, 0);
	guest_send(&g, SBX_NET_MSG_SHUTDOWN, 7, NULL, 0);
	CHECK_EQ(peer_read(peer, got, sizeof(got)), 0);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_CLOSE);
	CHECK_EQ(u32_at(f.payload), SBX_NET_CLOSE_DONE);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(ev.kind, SBX_NET_EV_CLOSED);
	CHECK_EQ(ev.bytes_from_guest, 11);
	CHECK_EQ(ev.bytes_to_guest, 5);
	CHECK_EQ(ev.status, 0);
	/* A late CREDIT crossing our CLOSE is fine; the guest's CLOSE frees the id. */
	guest_u32(&g, SBX_NET_MSG_CREDIT, 7, 5);
	guest_u32(&g, SBX_NET_MSG_CLOSE, 7, 0);
	pump();
	CHECK_EQ(sbx_net_ring_live(ring), 1);
	CHECK_EQ(sbx_net_ring_next_event(ring, &ev), 0);
	close(peer);
	stop(&g);
}

static void test_refusal_is_answered_with_status_and_reason(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	struct sbx_frame f;
	uint8_t buf[1024];

	guest_open(&g, 3, "evil.example", 80);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(sbx_net_open_reply(ring, relay, 3, SBX_NET_REFUSED_POLICY, "not allowed", 11, -1, &E), 0);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_OPENED);
	CHECK_EQ(f.id, 3);
	CHECK_EQ(u32_at(f.payload), SBX_NET_REFUSED_POLICY);
	CHECK_EQ(u32_at(f.payload + 4), 11);
	CHECK(memcmp(f.payload + 8, "not allowed", 11) == 0);
	CHECK_EQ(sbx_net_ring_live(ring), 1);
	/* Answering twice, or for a stream that never was, is -ENOENT. */
	CHECK_EQ(sbx_net_open_reply(ring, relay, 3, SBX_NET_REFUSED_POLICY, "x", 1, -1, &E), -ENOENT);
	stop(&g);
}

static void expect_violation(struct guest *g, const char *what)
{
	struct sbx_net_event ev;
	int seen = 0;
	pump();
	while (sbx_net_ring_next_event(ring, &ev) == 1)
		if (ev.kind == SBX_NET_EV_VIOLATION)
			seen = 1;
	if (!seen)
		fprintf(stderr, "no violation for: %s\n", what);
	CHECK(seen);
	(void)g;
}

static void test_window_overrun_kills_the_relay(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	static uint8_t chunk[SBX_NET_DATA_MAX];
	guest_open(&g, 1, "a.example", 80);
	CHECK_EQ(next_event(&ev), 1);
	/* Nobody answers, so nothing is credited: window + 1 byte breaks the protocol. */
	for (uint32_t sent = 0; sent + SBX_NET_DATA_MAX <= SBX_NET_WINDOW; sent += SBX_NET_DATA_MAX)
		guest_send(&g, SBX_NET_MSG_DATA, 1, chunk, SBX_NET_DATA_MAX);
	guest_send(&g, SBX_NET_MSG_DATA, 1, chunk, SBX_NET_WINDOW % SBX_NET_DATA_MAX + 1);
	expect_violation(&g, "window");
	CHECK_EQ(sbx_net_open_reply(ring, relay, 1, SBX_NET_OK, NULL, 0, dup(0), &E), -ENOENT);
	CHECK_EQ(sbx_net_relay_close(ring, relay, &E), 0);
	pump();
	CHECK_EQ(sbx_net_ring_live(ring), 0);
	stop(&g);
}

static void test_stream_count_overrun_kills_the_relay(void)
{
	struct guest g;
	start(&g);
	for (uint32_t i = 1; i <= SBX_NET_STREAMS_MAX + 1; i++)
		guest_open(&g, i, "a.example", 80);
	expect_violation(&g, "streams");
	stop(&g);
}

/* A relay with one host stream (Python's sbx_net_connect to guest port 8000) on a fresh peer. */
static uint32_t start_with_host_stream(struct guest *g, int *peer, uint32_t *stream)
{
	uint32_t relay = start(g);
	*stream = 0;
	CHECK_EQ(sbx_net_connect(ring, relay, 8000, peer_pair(peer), stream, &E), 0);
	return relay;
}

/* Host streams count against the same table: an OPEN that finds it full is refused by the relay
 * itself (TOO_MANY, the VM lives), and still reported, for the connection log. */
static void test_open_into_a_full_table_is_refused_and_reported(void)
{
	struct guest g;
	int peer;
	uint32_t stream;
	uint32_t relay = start_with_host_stream(&g, &peer, &stream);
	struct sbx_net_event ev;
	struct sbx_frame f;
	uint8_t buf[1024];
	for (uint32_t i = 1; i < SBX_NET_STREAMS_MAX; i++)
		guest_open(&g, i, "a.example", 80);
	guest_open(&g, SBX_NET_STREAMS_MAX, "full.example", 443);
	pump();
	int opens = 0, refused = 0;
	while (sbx_net_ring_next_event(ring, &ev) == 1) {
		CHECK(ev.kind == SBX_NET_EV_OPEN || ev.kind == SBX_NET_EV_REFUSED);
		if (ev.kind == SBX_NET_EV_OPEN) {
			opens++;
			continue;
		}
		refused++;
		CHECK_EQ(ev.relay, relay);
		CHECK_EQ(ev.stream, SBX_NET_STREAMS_MAX);
		CHECK_EQ(ev.port, 443);
		CHECK_EQ(ev.status, SBX_NET_TOO_MANY);
		CHECK(strcmp(ev.text, "full.example") == 0);
	}
	CHECK_EQ(opens, (int)SBX_NET_STREAMS_MAX - 1);
	CHECK_EQ(refused, 1);
	int answered = 0;
	while (guest_recv(&g, &f, buf, sizeof(buf)) == 1)
		if (f.type == SBX_NET_MSG_OPENED && f.id == SBX_NET_STREAMS_MAX &&
		    u32_at(f.payload) == SBX_NET_TOO_MANY)
			answered = 1;
	CHECK(answered);
	close(peer);
	stop(&g);
}

static void test_frames_the_guest_may_not_send_kill_the_relay(void)
{
	static const struct {
		const char *what;
		uint8_t type;
		uint32_t id;
	} cases[] = {
		{"DATA for an unknown stream", SBX_NET_MSG_DATA, 9},
		{"a host -> guest type", SBX_NET_MSG_OPENED, 9},
		{"an agent-channel type", 1, 9},
		{"CREDIT for an unknown stream", SBX_NET_MSG_CREDIT, 9},
		{"stream id 0", SBX_NET_MSG_SHUTDOWN, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct guest g;
		start(&g);
		guest_u32(&g, cases[i].type, cases[i].id, 1);
		expect_violation(&g, cases[i].what);
		stop(&g);
	}
}

static void test_credit_beyond_sent_kills_the_relay(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	int peer;
	guest_open(&g, 5, "a.example", 80);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(sbx_net_open_reply(ring, relay, 5, SBX_NET_OK, NULL, 0, peer_pair(&peer), &E), 0);
	guest_u32(&g, SBX_NET_MSG_CREDIT, 5, 1);
	expect_violation(&g, "credit");
	/* The relay reset the stream: the peer sees the end. */
	char c;
	CHECK_EQ(peer_read(peer, &c, 1), 0);
	close(peer);
	stop(&g);
}

static void test_host_connect_to_a_guest_port(void)
{
	struct guest g;
	int peer;
	uint32_t stream;
	start_with_host_stream(&g, &peer, &stream);
	struct sbx_net_event ev;
	struct sbx_frame f;
	uint8_t buf[1024];
	CHECK(stream & 0x80000000u);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_CONNECT);
	CHECK_EQ(f.id, stream);
	CHECK_EQ(u32_at(f.payload), 8000);
	/* The client's first bytes wait for CONNECTED. */
	CHECK_EQ(write(peer, "GET /", 5), 5);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 0);
	guest_u32(&g, SBX_NET_MSG_CONNECTED, stream, SBX_NET_OK);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(ev.kind, SBX_NET_EV_CONNECTED);
	CHECK_EQ(ev.status, SBX_NET_OK);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1);
	CHECK_EQ(f.type, SBX_NET_MSG_DATA);
	CHECK_EQ(f.payload_len, 5);
	guest_send(&g, SBX_NET_MSG_DATA, stream, "200 OK", 6);
	char got[16] = {0};
	CHECK_EQ(peer_read(peer, got, sizeof(got) - 1), 6);
	CHECK_STR(got, "200 OK");
	/* The guest closes: the peer sees EOF, CLOSED is reported, CLOSE answered. */
	guest_u32(&g, SBX_NET_MSG_CLOSE, stream, SBX_NET_CLOSE_DONE);
	CHECK_EQ(peer_read(peer, got, sizeof(got)), 0);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(ev.kind, SBX_NET_EV_CLOSED);
	CHECK_EQ(ev.bytes_to_guest, 5);
	CHECK_EQ(ev.bytes_from_guest, 6);
	int saw_close = 0;
	while (guest_recv(&g, &f, buf, sizeof(buf)) == 1)
		saw_close |= f.type == SBX_NET_MSG_CLOSE;
	CHECK(saw_close);
	pump();
	CHECK_EQ(sbx_net_ring_live(ring), 1);
	close(peer);
	stop(&g);
}

static void test_guest_refusing_connect_ends_the_stream(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	int peer;
	uint32_t stream = 0;
	CHECK_EQ(sbx_net_connect(ring, relay, 9, peer_pair(&peer), &stream, &E), 0);
	guest_u32(&g, SBX_NET_MSG_CONNECTED, stream, SBX_NET_CONNECT_FAILED);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(ev.kind, SBX_NET_EV_CONNECTED);
	CHECK_EQ(ev.status, SBX_NET_CONNECT_FAILED);
	char c;
	CHECK_EQ(peer_read(peer, &c, 1), 0);
	CHECK_EQ(sbx_net_ring_live(ring), 1);
	close(peer);
	stop(&g);
}

static void test_guest_close_after_data_still_delivers_the_data(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	struct sbx_frame f;
	uint8_t buf[1024];
	int peer;
	uint32_t stream = 0;
	/* A guest server that writes its answer and closes at once (an exposed port's reply). */
	CHECK_EQ(sbx_net_connect(ring, relay, 7000, peer_pair(&peer), &stream, &E), 0);
	guest_u32(&g, SBX_NET_MSG_CONNECTED, stream, SBX_NET_OK);
	guest_send(&g, SBX_NET_MSG_DATA, stream, "bye now", 7);
	guest_u32(&g, SBX_NET_MSG_CLOSE, stream, SBX_NET_CLOSE_DONE);
	char got[16] = {0};
	CHECK_EQ(peer_read(peer, got, sizeof(got) - 1), 7);
	CHECK_STR(got, "bye now");
	CHECK_EQ(peer_read(peer, got, sizeof(got)), 0);
	int saw_close = 0, saw_closed = 0;
	while (guest_recv(&g, &f, buf, sizeof(buf)) == 1)
		saw_close |= f.type == SBX_NET_MSG_CLOSE;
	while (sbx_net_ring_next_event(ring, &ev) == 1)
		saw_closed |= ev.kind == SBX_NET_EV_CLOSED && ev.bytes_from_guest == 7;
	CHECK(saw_close);
	CHECK(saw_closed);
	pump();
	CHECK_EQ(sbx_net_ring_live(ring), 1);
	close(peer);
	stop(&g);
}

static void test_port_eof_is_reported_and_close_frees_everything(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	guest_open(&g, 1, "a.example", 80);
	CHECK_EQ(next_event(&ev), 1);
	close(g.fd);
	g.fd = -1;
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(ev.kind, SBX_NET_EV_PORT_CLOSED);
	CHECK_EQ(sbx_net_relay_close(ring, relay, &E), 0);
	pump();
	CHECK_EQ(sbx_net_ring_live(ring), 0);
	CHECK_EQ(sbx_net_relay_close(ring, relay, &E), -ENOENT);
	stop(&g);
}

static void test_bulk_transfer_respects_windows(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_net_event ev;
	struct sbx_frame f;
	static uint8_t buf[70000];
	int peer;
	guest_open(&g, 2, "a.example", 80);
	CHECK_EQ(next_event(&ev), 1);
	CHECK_EQ(sbx_net_open_reply(ring, relay, 2, SBX_NET_OK, NULL, 0, peer_pair(&peer), &E), 0);
	CHECK_EQ(guest_recv(&g, &f, buf, sizeof(buf)), 1); /* OPENED */
	/* The peer writes two windows without the guest crediting: the relay stops at one. */
	static uint8_t big[2u * SBX_NET_WINDOW + 4096u];
	CHECK_EQ(fcntl(peer, F_SETFL, O_NONBLOCK), 0);
	size_t written = 0;
	for (int i = 0, stuck = 0; i < 400 && written < sizeof(big) && stuck < 10; i++) {
		ssize_t n = write(peer, big + written, sizeof(big) - written);
		if (n > 0)
			written += (size_t)n;
		stuck = n > 0 ? 0 : stuck + 1; /* the window is full once writes stop being taken */
		pump();
	}
	uint32_t got = 0;
	while (guest_recv(&g, &f, buf, sizeof(buf)) == 1)
		if (f.type == SBX_NET_MSG_DATA)
			got += f.payload_len;
	CHECK_EQ(got, SBX_NET_WINDOW);
	guest_u32(&g, SBX_NET_MSG_CREDIT, 2, SBX_NET_WINDOW);
	while (guest_recv(&g, &f, buf, sizeof(buf)) == 1)
		if (f.type == SBX_NET_MSG_DATA)
			got += f.payload_len;
	CHECK(got > SBX_NET_WINDOW);
	CHECK(got <= 2 * SBX_NET_WINDOW);
	close(peer);
	stop(&g);
}

/* The decoder's refusals: the code and what the guest got wrong, the reason its relay dies. */
static void test_decoder_refusals_say_why(void)
{
	static const uint8_t port0_name[] = {0, 0, 0, 0, 1, 0, 0, 0, 'a'};
	static const uint8_t port80_upper[] = {80, 0, 0, 0, 1, 0, 0, 0, 'A'};
	static const uint8_t port80_long[] = {80, 0, 0, 0, 0xff, 0, 0, 0};
	static const uint8_t status9[] = {9, 0, 0, 0};
	static const uint8_t credit0[] = {0, 0, 0, 0};
	static const uint8_t close2[] = {2, 0, 0, 0};
	static const uint8_t five[] = {0, 0, 0, 0, 0};
	static const struct {
		uint8_t type;
		uint32_t id;
		const uint8_t *p;
		uint32_t n;
		int rc;
		const char *says;
	} cases[] = {
		{SBX_NET_MSG_SHUTDOWN, 0, NULL, 0, -EPROTO, "stream id 0"},
		{SBX_NET_MSG_OPEN, 0x80000001u, port0_name, 9, -EPROTO, "host stream id"},
		{SBX_NET_MSG_OPEN, 1, port0_name, 3, -EPROTO, "OPEN port truncated"},
		{SBX_NET_MSG_OPEN, 1, port0_name, 9, -EPROTO, "OPEN port 0 out of 1..65535"},
		{SBX_NET_MSG_OPEN, 1, port80_upper, 9, -EPROTO, "not a lowercase DNS name"},
		{SBX_NET_MSG_OPEN, 1, port80_long, 8, -EMSGSIZE, "OPEN name over 253 bytes"},
		{SBX_NET_MSG_OPEN, 1, port80_upper, 6, -EPROTO, "OPEN name truncated"},
		{SBX_NET_MSG_CONNECTED, 1, status9, 4, -EPROTO, "guest stream id"},
		{SBX_NET_MSG_CONNECTED, 0x80000001u, status9, 4, -EPROTO, "status 9 unknown"},
		{SBX_NET_MSG_DATA, 1, NULL, 0, -EPROTO, "empty DATA"},
		{SBX_NET_MSG_CREDIT, 1, credit0, 4, -EPROTO, "CREDIT of 0 bytes"},
		{SBX_NET_MSG_CLOSE, 1, close2, 4, -EPROTO, "CLOSE code 2 unknown"},
		{SBX_NET_MSG_CLOSE, 1, five, 5, -EPROTO, "1 trailing bytes"},
		{SBX_NET_MSG_OPENED, 1, credit0, 4, -EPROTO, "not a guest -> host type"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sbx_frame f = {cases[i].type, cases[i].id, cases[i].p, cases[i].n};
		struct sbx_net_frame out;
		struct sbx_err err = {0};
		CHECK_EQ(sbx_net_decode(&f, &out, &err), cases[i].rc);
		CHECK_EQ(err.code, -cases[i].rc);
		CHECK_EQ(err.syscall, 0);
		if (!strstr(err.msg, cases[i].says)) {
			fprintf(stderr, "case %zu: \"%s\" does not say \"%s\"\n", i, err.msg,
				cases[i].says);
			CHECK(0);
		}
	}
	/* DATA over its limit, and a payload over the port's. */
	static uint8_t big[SBX_NET_FRAME_MAX + 1];
	struct sbx_frame f = {SBX_NET_MSG_DATA, 1, big, SBX_NET_DATA_MAX + 1};
	struct sbx_net_frame out;
	struct sbx_err err = {0};
	CHECK_EQ(sbx_net_decode(&f, &out, &err), -EMSGSIZE);
	CHECK(strstr(err.msg, "DATA of") != NULL);
	f.payload_len = SBX_NET_FRAME_MAX + 1;
	CHECK_EQ(sbx_net_decode(&f, &out, &err), -EMSGSIZE);
	CHECK(strstr(err.msg, "payload of") != NULL);
	/* A good one leaves err alone. */
	sbx_err_clear(&err);
	static const uint8_t open80[] = {80, 0, 0, 0, 1, 0, 0, 0, 'a'};
	f = (struct sbx_frame){SBX_NET_MSG_OPEN, 1, open80, sizeof(open80)};
	CHECK_EQ(sbx_net_decode(&f, &out, &err), 0);
	CHECK_EQ(err.code, 0);
	CHECK(out.value == 80 && out.len == 1 && out.data[0] == 'a');
}

/* A NET_REFUSED payload: what, port, count, subject. */
static size_t refused_payload(uint8_t *p, uint32_t what, uint32_t port, uint32_t count,
			      const char *subject)
{
	uint32_t v[4] = {what, port, count, (uint32_t)strlen(subject)};
	memcpy(p, v, sizeof(v)); /* little-endian host: the tests' builds are x86_64 */
	memcpy(p + sizeof(v), subject, strlen(subject));
	return sizeof(v) + strlen(subject);
}

static void test_guest_refusals_are_decoded_strictly(void)
{
	static const struct {
		uint32_t id, what, port, count;
		const char *subject;
		int rc;
		const char *says;
	} cases[] = {
		{0, SBX_NET_REFUSAL_NAME, 0, 1, "blocked.example", 0, ""},
		{0, SBX_NET_REFUSAL_ADDRESS, 443, 1, "8.8.8.8", 0, ""},
		{0, SBX_NET_REFUSAL_ADDRESS, 80, 1, "198.19.255.254", 0, ""},
		{0, SBX_NET_REFUSAL_DROPPED, 0, 12, "", 0, ""},
		{7, SBX_NET_REFUSAL_NAME, 0, 1, "a.example", -EPROTO, "REFUSED with stream id 7"},
		{0, 3, 0, 1, "a.example", -EPROTO, "what 3 unknown"},
		{0, SBX_NET_REFUSAL_NAME, 80, 1, "a.example", -EPROTO, "name malformed"},
		{0, SBX_NET_REFUSAL_NAME, 0, 2, "a.example", -EPROTO, "name malformed"},
		{0, SBX_NET_REFUSAL_NAME, 0, 1, "A.example", -EPROTO, "name malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 0, 1, "8.8.8.8", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 70000, 1, "8.8.8.8", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 80, 1, "8.8.8", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 80, 1, "8.8.8.256", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 80, 1, "8.8.8.08", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 80, 1, "8.8.8.8.", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_ADDRESS, 80, 1, "a.example", -EPROTO, "address malformed"},
		{0, SBX_NET_REFUSAL_DROPPED, 0, 0, "", -EPROTO, "dropped count malformed"},
		{0, SBX_NET_REFUSAL_DROPPED, 0, 5, "x", -EPROTO, "dropped count malformed"},
		{0, SBX_NET_REFUSAL_DROPPED, 0, SBX_NET_REFUSAL_COUNT_MAX + 1, "", -EPROTO,
		 "dropped count malformed"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t p[64];
		size_t n = refused_payload(p, cases[i].what, cases[i].port, cases[i].count,
					   cases[i].subject);
		struct sbx_frame f = {SBX_NET_MSG_REFUSED, cases[i].id, p, (uint32_t)n};
		struct sbx_net_frame out;
		struct sbx_err err = {0};
		CHECK_EQ(sbx_net_decode(&f, &out, &err), cases[i].rc);
		if (cases[i].rc == 0) {
			CHECK(out.value == cases[i].what && out.port == cases[i].port &&
			      out.count == cases[i].count && out.len == strlen(cases[i].subject));
			/* One byte more is a trailing byte; one less a truncated subject. */
			f.payload_len = (uint32_t)n + 1;
			CHECK_EQ(sbx_net_decode(&f, &out, &err), -EPROTO);
			if (n > 16) {
				f.payload_len = (uint32_t)n - 1;
				CHECK_EQ(sbx_net_decode(&f, &out, &err), -EPROTO);
			}
		} else if (!strstr(err.msg, cases[i].says)) {
			fprintf(stderr, "case %zu: \"%s\" does not say \"%s\"\n", i, err.msg,
				cases[i].says);
			CHECK(0);
		}
	}
}

static void test_guest_refusals_are_events_within_the_relays_bound(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	uint8_t p[64];
	struct sbx_net_event ev;
	guest_send(&g, SBX_NET_MSG_REFUSED, 0, p,
		   refused_payload(p, SBX_NET_REFUSAL_ADDRESS, 443, 1, "8.8.8.8"));
	pump();
	CHECK_EQ(next_event(&ev), 1);
	CHECK(ev.kind == SBX_NET_EV_GUEST_REFUSED && ev.relay == relay && ev.stream == 0);
	CHECK(ev.status == SBX_NET_REFUSAL_ADDRESS && ev.port == 443 && ev.count == 1);
	CHECK(strcmp(ev.text, "8.8.8.8") == 0);
	CHECK_EQ(next_event(&ev), 0);
	/* A guest that ignores its own rate limit: the burst passes, the rest is counted, and told
	 * with the next report let through once the bucket refills. */
	unsigned flood = SBX_NET_RELAY_REFUSALS_BURST + 40;
	for (unsigned i = 0; i < flood; i++)
		guest_send(&g, SBX_NET_MSG_REFUSED, 0, p,
			   refused_payload(p, SBX_NET_REFUSAL_NAME, 0, 1, "x.example"));
	pump();
	unsigned events = 0;
	while (next_event(&ev) == 1) {
		CHECK(ev.kind == SBX_NET_EV_GUEST_REFUSED && ev.status == SBX_NET_REFUSAL_NAME);
		events++;
	}
	/* The rest of the burst, and what the clock refilled meanwhile (a few ms: none or one). */
	CHECK(events >= SBX_NET_RELAY_REFUSALS_BURST - 1 && events < flood);
	usleep(2 * 1000000 / SBX_NET_RELAY_REFUSALS_PER_SECOND);
	guest_send(&g, SBX_NET_MSG_REFUSED, 0, p,
		   refused_payload(p, SBX_NET_REFUSAL_DROPPED, 0, 5, ""));
	pump();
	CHECK_EQ(next_event(&ev), 1);
	CHECK(ev.kind == SBX_NET_EV_GUEST_REFUSED && ev.status == SBX_NET_REFUSAL_DROPPED);
	CHECK_EQ(ev.count, flood - events + 5);
	CHECK_EQ(next_event(&ev), 0);
	guest_send(&g, SBX_NET_MSG_REFUSED, 0, p,
		   refused_payload(p, SBX_NET_REFUSAL_NAME, 0, 1, "y.example"));
	pump();
	CHECK_EQ(next_event(&ev), 1);
	CHECK(ev.status == SBX_NET_REFUSAL_NAME && strcmp(ev.text, "y.example") == 0);
	/* A malformed one is a violation like any bad frame. */
	guest_send(&g, SBX_NET_MSG_REFUSED, 0, p,
		   refused_payload(p, SBX_NET_REFUSAL_NAME, 0, 1, "Y.example"));
	expect_violation(&g, "REFUSED name malformed");
	stop(&g);
}

/* What the relay's calls refuse, each with its code and an explanation (py_errors.c turns them
 * into the Python exceptions NetRing documents). */
static void test_calls_explain_their_refusals(void)
{
	struct guest g;
	uint32_t relay = start(&g);
	struct sbx_err err = {0};
	uint32_t stream = 0;
	int peer;
	CHECK_EQ(sbx_net_connect(ring, relay, 0, peer_pair(&peer), &stream, &err), -EINVAL);
	CHECK(err.code == EINVAL && !err.syscall && strstr(err.msg, "1..65535"));
	close(peer);
	CHECK_EQ(sbx_net_connect(ring, relay + 1, 80, peer_pair(&peer), &stream, &err), -ENOENT);
	CHECK(err.code == ENOENT && strstr(err.msg, "has ended"));
	close(peer);
	CHECK_EQ(sbx_net_open_reply(ring, relay, 1, SBX_NET_OK, NULL, 0, -1, &err), -EINVAL);
	CHECK(err.code == EINVAL && strstr(err.msg, "status 0 only"));
	CHECK_EQ(sbx_net_open_reply(ring, relay, 1, SBX_NET_REFUSED_POLICY, "x", 1, -1, &err),
		 -ENOENT);
	CHECK(err.code == ENOENT && strstr(err.msg, "stream 1 of relay"));
	static uint8_t big[SBX_NET_FRAME_MAX + SBX_FRAME_HEADER_SIZE + 1];
	CHECK_EQ(sbx_net_relay_ingest(ring, relay, big, sizeof(big), &err), -EINVAL);
	CHECK(err.code == EINVAL && strstr(err.msg, "one maximal frame"));
	CHECK_EQ(sbx_net_relay_ingest(ring, relay + 1, big, 1, &err), -ENOENT);
	CHECK_EQ(sbx_net_relay_close(ring, relay + 1, &err), -ENOENT);
	CHECK(err.code == ENOENT && strstr(err.msg, "no relay"));
	/* The table full of host streams: EBUSY, what Python logs as too many streams. */
	int peers[SBX_NET_STREAMS_MAX];
	for (unsigned i = 0; i < SBX_NET_STREAMS_MAX; i++)
		CHECK_EQ(sbx_net_connect(ring, relay, 8000, peer_pair(&peers[i]), &stream, &E), 0);
	CHECK_EQ(sbx_net_connect(ring, relay, 8000, peer_pair(&peer), &stream, &err), -EBUSY);
	CHECK(err.code == EBUSY && strstr(err.msg, "streams open"));
	close(peer);
	for (unsigned i = 0; i < SBX_NET_STREAMS_MAX; i++)
		close(peers[i]);
	stop(&g);
}

int main(void)
{
	RUN(test_open_is_an_event_and_bytes_flow_both_ways);
	RUN(test_refusal_is_answered_with_status_and_reason);
	RUN(test_window_overrun_kills_the_relay);
	RUN(test_stream_count_overrun_kills_the_relay);
	RUN(test_open_into_a_full_table_is_refused_and_reported);
	RUN(test_frames_the_guest_may_not_send_kill_the_relay);
	RUN(test_credit_beyond_sent_kills_the_relay);
	RUN(test_host_connect_to_a_guest_port);
	RUN(test_guest_refusing_connect_ends_the_stream);
	RUN(test_guest_close_after_data_still_delivers_the_data);
	RUN(test_port_eof_is_reported_and_close_frees_everything);
	RUN(test_bulk_transfer_respects_windows);
	RUN(test_decoder_refusals_say_why);
	RUN(test_guest_refusals_are_decoded_strictly);
	RUN(test_guest_refusals_are_events_within_the_relays_bound);
	RUN(test_calls_explain_their_refusals);
	TEST_MAIN_END("test_net_relay");
}
