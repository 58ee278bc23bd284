/* The agent's background-process parts that need no process (guest/src/proc_ring.c and the
 * PROC_* parsers of agent_request_guest.c), on the host: ring offsets, growth, the shared budget
 * and what is dropped; every limit of the requests. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "frame.h"
#include "../../guest/src/agent_request_guest.h"
#include "../../guest/src/proc_ring.h"

/* Byte i of a stream is (i * 7 + i / 251) % 256: a dropped or misplaced byte shows. */
static uint8_t byte_at(uint64_t i)
{
	return (uint8_t)((i * 7u + i / 251u) % 256u);
}

static void feed(struct sbx_ring *r, struct sbx_ring_budget *b, size_t n)
{
	uint8_t *buf = malloc(n);
	for (size_t i = 0; i < n; i++)
		buf[i] = byte_at(r->end + i);
	sbx_ring_write(r, b, buf, n);
	free(buf);
}

/* Every byte from `offset` on that the ring holds is the stream's. */
static int ring_consistent(const struct sbx_ring *r, uint64_t offset)
{
	static uint8_t out[64 * 1024];
	uint64_t from;
	long n = sbx_ring_read(r, offset, out, sizeof(out), &from);
	if (n < 0)
		return 0;
	for (long i = 0; i < n; i++)
		if (out[i] != byte_at(from + (uint64_t)i))
			return 0;
	return 1;
}

static void test_ring_offsets_and_growth(void)
{
	struct sbx_ring_budget b = {0, 1u << 20};
	struct sbx_ring r;
	sbx_ring_init(&r, 64 * 1024);
	uint8_t out[100];
	uint64_t from = 99;
	CHECK_EQ(sbx_ring_read(&r, 0, out, sizeof(out), &from), 0);
	CHECK_EQ(from, 0);
	CHECK_EQ(sbx_ring_read(&r, 1, out, sizeof(out), &from), -ERANGE);
	feed(&r, &b, 10);
	CHECK_EQ(r.cap, SBX_RING_MIN_CAP);
	CHECK_EQ(b.used, 0); /* the first SBX_RING_MIN_CAP bytes are outside the budget */
	CHECK_EQ(sbx_ring_read(&r, 3, out, 4, &from), 4);
	CHECK_EQ(from, 3);
	CHECK(out[0] == byte_at(3) && out[3] == byte_at(6));
	CHECK_EQ(sbx_ring_read(&r, 10, out, 4, &from), 0);
	CHECK_EQ(sbx_ring_read(&r, 11, out, 4, &from), -ERANGE);
	/* Grows by doubling while the stream fits its limit: nothing dropped. */
	for (int i = 0; i < 60; i++)
		feed(&r, &b, 1000);
	CHECK_EQ(r.end, 60010);
	CHECK_EQ(r.start, 0);
	CHECK_EQ(r.cap, 64 * 1024);
	CHECK_EQ(b.used, 64 * 1024 - SBX_RING_MIN_CAP);
	CHECK(ring_consistent(&r, 0));
	/* Past the limit: the oldest bytes go, the offsets stay absolute. */
	feed(&r, &b, 10000);
	CHECK_EQ(r.end, 70010);
	CHECK_EQ(r.start, 70010 - 64 * 1024);
	CHECK(ring_consistent(&r, 0));
	CHECK_EQ(sbx_ring_read(&r, 5, out, 10, &from), 10);
	CHECK_EQ(from, r.start); /* a reader that fell behind: the jump shows in the offset */
	/* One write longer than the ring: only its last cap bytes. */
	feed(&r, &b, 200000);
	CHECK_EQ(r.end, 270010);
	CHECK_EQ(r.start, 270010 - 64 * 1024);
	CHECK(ring_consistent(&r, r.start));
	CHECK(ring_consistent(&r, r.end - 1));
	sbx_ring_free(&r, &b);
	CHECK_EQ(b.used, 0);
}

static void test_ring_wraps(void)
{
	struct sbx_ring_budget b = {0, 0};
	struct sbx_ring r;
	sbx_ring_init(&r, SBX_RING_MIN_CAP);
	/* Odd sizes so that writes and reads straddle the end of the buffer. */
	for (int i = 0; i < 200; i++) {
		feed(&r, &b, 37 + (size_t)i * 13 % 1500);
		CHECK(r.end - r.start <= SBX_RING_MIN_CAP);
		CHECK(ring_consistent(&r, r.start));
		CHECK(ring_consistent(&r, r.start + (r.end - r.start) / 2));
	}
	CHECK_EQ(r.cap, SBX_RING_MIN_CAP);
	sbx_ring_free(&r, &b);
}

static void test_ring_budget_is_shared(void)
{
	/* Room for one ring to grow to 16 KiB, not two. */
	struct sbx_ring_budget b = {0, 16 * 1024 - SBX_RING_MIN_CAP};
	struct sbx_ring r1, r2;
	sbx_ring_init(&r1, 1u << 20);
	sbx_ring_init(&r2, 1u << 20);
	feed(&r1, &b, 16 * 1024);
	CHECK_EQ(r1.cap, 16 * 1024);
	CHECK_EQ(b.used, b.max);
	feed(&r2, &b, 16 * 1024);
	CHECK_EQ(r2.cap, SBX_RING_MIN_CAP); /* its first bytes still, but no growth */
	CHECK_EQ(r2.end - r2.start, SBX_RING_MIN_CAP);
	CHECK(ring_consistent(&r2, 0));
	/* The budget a ring gives back lets another grow. */
	sbx_ring_free(&r1, &b);
	CHECK_EQ(b.used, 0);
	feed(&r2, &b, 100);
	CHECK(r2.cap > SBX_RING_MIN_CAP);
	CHECK(ring_consistent(&r2, r2.start));
	/* A partial grant: what is left of the budget, not a doubling. */
	sbx_ring_free(&r2, &b);
	struct sbx_ring_budget small = {0, 1000};
	struct sbx_ring r3;
	sbx_ring_init(&r3, 1u << 20);
	feed(&r3, &small, 20000);
	CHECK_EQ(r3.cap, SBX_RING_MIN_CAP + 1000);
	CHECK_EQ(small.used, 1000);
	CHECK(ring_consistent(&r3, 0));
	sbx_ring_free(&r3, &small);
	CHECK_EQ(small.used, 0);
}

/* --- parsers --------------------------------------------------------------------------------- */

static void put_u16(struct sbx_buf *b, uint16_t v)
{
	uint8_t le[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
	sbx_buf_append(b, le, 2);
}

static void spawn_frame(struct sbx_buf *b, uint8_t flags, uint16_t cols, uint16_t rows,
			uint32_t argc, const char *const *argv, const char *cwd, const char *env_name)
{
	b->len = 0;
	sbx_put_u8(b, flags);
	put_u16(b, cols);
	put_u16(b, rows);
	sbx_put_u32(b, argc);
	for (uint32_t i = 0; i < argc; i++)
		sbx_put_str(b, argv[i], strlen(argv[i]));
	sbx_put_str(b, cwd, strlen(cwd));
	sbx_put_u32(b, env_name ? 1 : 0);
	if (env_name) {
		sbx_put_str(b, env_name, strlen(env_name));
		sbx_put_str(b, "v", 1);
	}
}

static int parse_spawn(const struct sbx_buf *b)
{
	static struct sbx_proc_spawn_request req;
	const char *why = NULL;
	int rc = sbx_parse_proc_spawn(b->data, b->len, &req, &why);
	if (rc < 0)
		CHECK(why && why[0]);
	return rc;
}

static void test_parse_spawn(void)
{
	static struct sbx_proc_spawn_request req;
	struct sbx_buf b = {0};
	const char *argv[] = {"sh", "-c", "echo hi"};
	const char *why = NULL;
	spawn_frame(&b, 0, 0, 0, 3, argv, "/tmp", "FOO");
	CHECK_EQ(sbx_parse_proc_spawn(b.data, b.len, &req, &why), 0);
	CHECK_EQ(req.argc, 3);
	CHECK(req.argv[2].n == 7 && memcmp(req.argv[2].p, "echo hi", 7) == 0);
	CHECK(req.cwd.n == 4 && memcmp(req.cwd.p, "/tmp", 4) == 0);
	CHECK_EQ(req.env_count, 1);
	spawn_frame(&b, SBX_SPAWN_PTY, 80, 24, 1, argv, "", NULL);
	CHECK_EQ(sbx_parse_proc_spawn(b.data, b.len, &req, &why), 0);
	CHECK(req.flags == SBX_SPAWN_PTY && req.cols == 80 && req.rows == 24 && req.cwd.n == 0);
	spawn_frame(&b, SBX_SPAWN_PTY, 1000, 1, 1, argv, "", NULL);
	CHECK_EQ(parse_spawn(&b), 0);

	/* Each limit. */
	spawn_frame(&b, 2, 0, 0, 1, argv, "", NULL);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	spawn_frame(&b, 0, 80, 24, 1, argv, "", NULL); /* a size without a pty */
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	spawn_frame(&b, SBX_SPAWN_PTY, 0, 24, 1, argv, "", NULL);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	spawn_frame(&b, SBX_SPAWN_PTY, 80, 1001, 1, argv, "", NULL);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	spawn_frame(&b, 0, 0, 0, 0, argv, "", NULL);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	const char *empty[] = {""};
	spawn_frame(&b, 0, 0, 0, 1, empty, "", NULL);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	spawn_frame(&b, 0, 0, 0, 1, argv, "tmp", NULL);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	spawn_frame(&b, 0, 0, 0, 1, argv, "", "9X");
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	/* argc over the limit, before any argument is read */
	spawn_frame(&b, 0, 0, 0, 1, argv, "", NULL);
	b.len = 5;
	sbx_put_u32(&b, SBX_PROC_ARGV_MAX + 1);
	CHECK_EQ(parse_spawn(&b), -EMSGSIZE);
	/* an argument over SBX_PROC_ARG_MAX: the length alone is refused */
	spawn_frame(&b, 0, 0, 0, 1, argv, "", NULL);
	b.len = 9;
	sbx_put_u32(&b, SBX_PROC_ARG_MAX + 1);
	CHECK_EQ(parse_spawn(&b), -EMSGSIZE);
	/* a NUL inside an argument and inside cwd */
	spawn_frame(&b, 0, 0, 0, 1, argv, "", NULL);
	b.len = 9;
	sbx_put_str(&b, "a\0b", 3);
	sbx_put_str(&b, "", 0);
	sbx_put_u32(&b, 0);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	b.len = 9;
	sbx_put_str(&b, "a", 1);
	sbx_put_str(&b, "/a\0b", 4);
	sbx_put_u32(&b, 0);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	/* truncated anywhere, or a byte too many */
	spawn_frame(&b, 0, 0, 0, 3, argv, "/tmp", "FOO");
	size_t full = b.len;
	for (size_t n = 0; n < full; n++)
		CHECK_EQ(sbx_parse_proc_spawn(b.data, n, &req, &why), -EPROTO);
	sbx_put_u8(&b, 0);
	CHECK_EQ(parse_spawn(&b), -EPROTO);
	sbx_buf_free(&b);
}

static int parse_req(uint8_t type, const struct sbx_buf *b, struct sbx_proc_request *r)
{
	const char *why = NULL;
	int rc = sbx_parse_proc_request(type, b->data, b->len, r, &why);
	if (rc < 0)
		CHECK(why && why[0]);
	return rc;
}

static void read_frame(struct sbx_buf *b, uint32_t pid, uint8_t stream, uint64_t off, uint32_t max,
		       uint32_t wait_ms)
{
	b->len = 0;
	sbx_put_u32(b, pid);
	sbx_put_u8(b, stream);
	sbx_put_u64(b, off);
	sbx_put_u32(b, max);
	sbx_put_u32(b, wait_ms);
}

static void test_parse_requests(void)
{
	struct sbx_buf b = {0};
	struct sbx_proc_request r;
	read_frame(&b, 42, SBX_PROC_STDERR, 1ull << 40, SBX_OUTPUT_CHUNK_MAX, SBX_PROC_WAIT_MS_MAX);
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), 0);
	CHECK(r.pid == 42 && r.stream == SBX_PROC_STDERR && r.offset == 1ull << 40 &&
	      r.max == SBX_OUTPUT_CHUNK_MAX && r.wait_ms == SBX_PROC_WAIT_MS_MAX);
	read_frame(&b, 42, 3, 0, 1, 0);
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), -EPROTO);
	read_frame(&b, 42, 1, 0, 0, 0);
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), -EPROTO);
	read_frame(&b, 42, 1, 0, SBX_OUTPUT_CHUNK_MAX + 1, 0);
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), -EPROTO);
	read_frame(&b, 42, 1, 0, 1, SBX_PROC_WAIT_MS_MAX + 1);
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), -EPROTO);
	read_frame(&b, 0, 1, 0, 1, 0);
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), -EPROTO);
	read_frame(&b, 42, 1, 0, 1, 0);
	b.len--;
	CHECK_EQ(parse_req(SBX_MSG_PROC_READ, &b, &r), -EPROTO);

	/* WRITE: the data is the rest of the payload. */
	static uint8_t big[SBX_PROC_WRITE_MAX + 1];
	b.len = 0;
	sbx_put_u32(&b, 7);
	sbx_put_u8(&b, SBX_PROC_CLOSE_STDIN);
	CHECK_EQ(parse_req(SBX_MSG_PROC_WRITE, &b, &r), 0);
	CHECK(r.flags == SBX_PROC_CLOSE_STDIN && r.data.n == 0);
	sbx_buf_append(&b, big, SBX_PROC_WRITE_MAX);
	CHECK_EQ(parse_req(SBX_MSG_PROC_WRITE, &b, &r), 0);
	CHECK_EQ(r.data.n, SBX_PROC_WRITE_MAX);
	CHECK(r.data.p == b.data + 5);
	sbx_buf_append(&b, big, 1);
	CHECK_EQ(parse_req(SBX_MSG_PROC_WRITE, &b, &r), -EMSGSIZE);
	b.len = 4;
	sbx_put_u8(&b, 2);
	CHECK_EQ(parse_req(SBX_MSG_PROC_WRITE, &b, &r), -EPROTO);

	/* SIGNAL, WAIT, LIST, RESIZE. */
	uint32_t signals[][2] = {{1, 0}, {64, 0}, {0, 1}, {65, 1}};
	for (size_t i = 0; i < 4; i++) {
		b.len = 0;
		sbx_put_u32(&b, 7);
		sbx_put_u32(&b, signals[i][0]);
		CHECK_EQ(parse_req(SBX_MSG_PROC_SIGNAL, &b, &r), signals[i][1] ? -EPROTO : 0);
	}
	b.len = 0;
	sbx_put_u32(&b, 7);
	sbx_put_u32(&b, SBX_PROC_WAIT_MS_MAX);
	CHECK_EQ(parse_req(SBX_MSG_PROC_WAIT, &b, &r), 0);
	b.len = 4;
	sbx_put_u32(&b, SBX_PROC_WAIT_MS_MAX + 1);
	CHECK_EQ(parse_req(SBX_MSG_PROC_WAIT, &b, &r), -EPROTO);
	b.len = 0;
	CHECK_EQ(parse_req(SBX_MSG_PROC_LIST, &b, &r), 0);
	sbx_put_u8(&b, 0);
	CHECK_EQ(parse_req(SBX_MSG_PROC_LIST, &b, &r), -EPROTO);
	uint16_t sizes[][3] = {{1, 1, 0}, {1000, 1000, 0}, {0, 5, 1}, {5, 0, 1}, {1001, 5, 1}};
	for (size_t i = 0; i < 5; i++) {
		b.len = 0;
		sbx_put_u32(&b, 7);
		put_u16(&b, sizes[i][0]);
		put_u16(&b, sizes[i][1]);
		CHECK_EQ(parse_req(SBX_MSG_PROC_RESIZE, &b, &r), sizes[i][2] ? -EPROTO : 0);
	}
	/* Not a process request at all. */
	CHECK_EQ(parse_req(SBX_MSG_PROC_SPAWN, &b, &r), -EPROTO);
	CHECK_EQ(parse_req(SBX_MSG_PING, &b, &r), -EPROTO);
	sbx_buf_free(&b);
}

int main(void)
{
	RUN(test_ring_offsets_and_growth);
	RUN(test_ring_wraps);
	RUN(test_ring_budget_is_shared);
	RUN(test_parse_spawn);
	RUN(test_parse_requests);
	TEST_MAIN_END("test_guest_procs");
}
