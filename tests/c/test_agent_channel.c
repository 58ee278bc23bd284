/* Unit tests of the host end of the agent channel (agent_channel.c) over a real socketpair. */
#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_channel.h"
#include "test.h"

/* Where a test does not look at the explanation of an error. */
static struct sbx_err E;

static struct sbx_channel CH; /* 64 KiB scratch: keep it off the stack */

/* ch owns sv[0] (non-blocking); the test plays the guest on sv[1]. */
static int setup(int *peer)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	sbx_channel_init(&CH, sv[0]);
	*peer = sv[1];
	return 0;
}

static void put_frame(struct sbx_buf *b, uint8_t type, uint32_t id, const void *p, size_t n)
{
	size_t start;
	sbx_frame_begin(b, type, id, &start);
	sbx_buf_append(b, p, n);
	sbx_frame_end(b, start, UINT32_MAX);
}

/* Read and drain until no progress; count events of each kind into counts[kind]. */
static int pump(int counts[8], uint32_t *last_len)
{
	struct sbx_event ev;
	for (;;) {
		int rc;
		while ((rc = sbx_channel_next_event(&CH, &ev)) == 1) {
			counts[ev.kind]++;
			if (last_len)
				*last_len = ev.len;
		}
		if (rc < 0)
			return rc;
		ssize_t n = sbx_channel_read(&CH, 1 << 20, &E);
		if (n < 0)
			return (int)n;
		if (n == 0)
			return 0;
	}
}

static void test_events_and_eof(void)
{
	int peer;
	CHECK_EQ(setup(&peer), 0);
	struct sbx_buf b = {0};
	put_frame(&b, SBX_MSG_PONG, 1, NULL, 0);
	put_frame(&b, SBX_MSG_STDOUT, 2, "abc", 3);
	put_frame(&b, SBX_MSG_STDERR, 2, "e", 1);
	/* Half a frame: not an event yet. */
	CHECK_EQ(write(peer, b.data, b.len - 1), (ssize_t)b.len - 1);
	int counts[8] = {0};
	CHECK_EQ(pump(counts, NULL), 0);
	CHECK_EQ(counts[SBX_EV_PONG], 1);
	CHECK_EQ(counts[SBX_EV_STDOUT], 1);
	CHECK_EQ(counts[SBX_EV_STDERR], 0);
	CHECK_EQ(CH.eof, 0);
	CHECK_EQ(write(peer, b.data + b.len - 1, 1), 1);
	CHECK_EQ(pump(counts, NULL), 0);
	CHECK_EQ(counts[SBX_EV_STDERR], 1);
	close(peer);
	CHECK_EQ(pump(counts, NULL), 0);
	CHECK_EQ(CH.eof, 1);
	CHECK_EQ(sbx_channel_read(&CH, 100, &E), 0);
	sbx_channel_destroy(&CH);
	CHECK_EQ(CH.fd, -1);
	sbx_channel_destroy(&CH); /* idempotent */
	sbx_buf_free(&b);
}

static void test_many_max_frames(void)
{
	/* More than the socket buffer and more than two maximal frames in flight: exercised
	 * through repeated read/drain cycles. */
	int peer;
	CHECK_EQ(setup(&peer), 0);
	static uint8_t chunk[SBX_OUTPUT_CHUNK_MAX];
	memset(chunk, 'z', sizeof(chunk));
	struct sbx_buf b = {0};
	for (int i = 0; i < 64; i++)
		put_frame(&b, SBX_MSG_STDOUT, 5, chunk, sizeof(chunk));
	int counts[8] = {0};
	size_t off = 0;
	uint32_t last = 0;
	fcntl(peer, F_SETFL, O_NONBLOCK);
	while (off < b.len) {
		ssize_t w = write(peer, b.data + off, b.len - off);
		if (w > 0)
			off += (size_t)w;
		CHECK_EQ(pump(counts, &last), 0);
	}
	CHECK_EQ(pump(counts, &last), 0);
	CHECK_EQ(counts[SBX_EV_STDOUT], 64);
	CHECK_EQ(last, SBX_OUTPUT_CHUNK_MAX);
	close(peer);
	sbx_channel_destroy(&CH);
	sbx_buf_free(&b);
}

static void test_protocol_error_sticky(void)
{
	int peer;
	CHECK_EQ(setup(&peer), 0);
	struct sbx_buf b = {0};
	put_frame(&b, SBX_MSG_PONG, 1, NULL, 0);
	put_frame(&b, SBX_MSG_EXEC, 2, NULL, 0); /* host->guest type from the guest */
	put_frame(&b, SBX_MSG_PONG, 3, NULL, 0);
	CHECK_EQ(write(peer, b.data, b.len), (ssize_t)b.len);
	int counts[8] = {0};
	CHECK_EQ(pump(counts, NULL), -EPROTO);
	CHECK_EQ(counts[SBX_EV_PONG], 1);
	CHECK_EQ(CH.error_frame_type, SBX_MSG_EXEC);
	struct sbx_event ev;
	CHECK_EQ(sbx_channel_next_event(&CH, &ev), -EPROTO);
	CHECK_EQ(sbx_channel_read(&CH, 100, &E), -EPROTO);
	CHECK_EQ(sbx_channel_ingest(&CH, "x", 1), -EPROTO);
	struct sbx_err why;
	sbx_channel_error(&CH, &why);
	CHECK_EQ(why.code, EPROTO);
	CHECK_STR(why.msg, "guest sent a frame of unexpected type 64");
	close(peer);
	sbx_channel_destroy(&CH);

	/* Oversized header. */
	CHECK_EQ(setup(&peer), 0);
	uint8_t hdr[12] = {0xff, 0xff, 0xff, 0x7f, SBX_MSG_STDOUT};
	CHECK_EQ(write(peer, hdr, 12), 12);
	CHECK_EQ(pump(counts, NULL), -EMSGSIZE);
	sbx_channel_error(&CH, &why);
	CHECK_EQ(why.code, EMSGSIZE);
	CHECK_STR(why.msg, "guest sent a frame larger than GUEST_FRAME_MAX");
	CHECK_EQ(CH.error_frame_type, -1);
	close(peer);
	sbx_channel_destroy(&CH);

	/* Malformed EXIT payload. */
	CHECK_EQ(setup(&peer), 0);
	b.len = 0;
	put_frame(&b, SBX_MSG_EXIT, 2, "0123456789abcdef", 16); /* code way out of range */
	CHECK_EQ(write(peer, b.data, b.len), (ssize_t)b.len);
	CHECK_EQ(pump(counts, NULL), -EPROTO);
	CHECK_EQ(CH.error_frame_type, SBX_MSG_EXIT);
	close(peer);
	sbx_channel_destroy(&CH);
	sbx_buf_free(&b);
}

static void test_flush_partial(void)
{
	int peer;
	CHECK_EQ(setup(&peer), 0);
	int small = 4096;
	setsockopt(CH.fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	setsockopt(peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	size_t code_len = 1000000;
	uint8_t *code = malloc(code_len);
	for (size_t i = 0; i < code_len; i++)
		code[i] = (uint8_t)(i * 7);
	struct sbx_exec_req r = {.id = 3, .language = SBX_LANG_PYTHON, .timeout_ms = 1000,
				 .code = code, .code_len = code_len};
	CHECK_EQ(sbx_channel_queue_exec(&CH, &r, &E), 0);
	size_t total = sbx_channel_pending(&CH) + 0;
	CHECK(total > 0);               /* the socket could not take it all */
	CHECK_EQ(sbx_channel_queue_ping(&CH, 4, &E), 0);
	CHECK_EQ(sbx_channel_pending(&CH), total + 12);

	/* Be the guest: read everything while the host flushes. */
	struct sbx_reader rd;
	struct sbx_frame f;
	sbx_reader_init(&rd, SBX_HOST_FRAME_MAX);
	uint8_t *tmp = malloc(1 << 16);
	int frames = 0, flushes = 0;
	while (frames < 2) {
		CHECK_EQ(sbx_channel_flush(&CH, &E), 0);
		flushes++;
		ssize_t n = recv(peer, tmp, 1 << 16, MSG_DONTWAIT);
		if (n > 0)
			CHECK_EQ(sbx_reader_feed(&rd, tmp, (size_t)n), 0);
		while (sbx_reader_next(&rd, &f) == 1) {
			frames++;
			if (f.type == SBX_MSG_EXEC) {
				CHECK_EQ(f.id, 3);
				/* u8 + 4*u32 + u32 len, then the code */
				CHECK(memcmp(f.payload + 21, code, code_len) == 0);
			} else {
				CHECK_EQ(f.type, SBX_MSG_PING);
				CHECK_EQ(f.id, 4);
			}
		}
		if (flushes > 100000)
			break;
	}
	CHECK_EQ(frames, 2);
	CHECK(flushes > 1);
	CHECK_EQ(sbx_channel_pending(&CH), 0);

	/* Queue limit. */
	r.code_len = SBX_CODE_MAX;
	free(code);
	code = calloc(1, SBX_CODE_MAX);
	r.code = code;
	int rc = 0;
	for (int i = 0; i < 20 && rc == 0; i++)
		rc = sbx_channel_queue_exec(&CH, &r, &E);
	CHECK_EQ(rc, -ENOBUFS);
	CHECK(sbx_channel_pending(&CH) <= SBX_CHANNEL_OUT_MAX);

	/* Peer gone: EPIPE, no SIGPIPE (MSG_NOSIGNAL), the frame stays queued. */
	close(peer);
	size_t before = sbx_channel_pending(&CH);
	CHECK_EQ(sbx_channel_queue_ping(&CH, 9, &E), -EPIPE);
	CHECK(sbx_channel_pending(&CH) >= before);
	CHECK_EQ(sbx_channel_flush(&CH, &E), -EPIPE);
	sbx_reader_free(&rd);
	sbx_channel_destroy(&CH);
	CHECK_EQ(sbx_channel_flush(&CH, &E), 0); /* nothing queued after destroy */
	free(tmp);
	free(code);
}

int main(void)
{
	RUN(test_events_and_eof);
	RUN(test_many_max_frames);
	RUN(test_protocol_error_sticky);
	RUN(test_flush_partial);
	TEST_MAIN_END("test_agent_channel");
}
