/* Unit tests of the shared frame codec (src/shared/frame.c). */
#include <errno.h>
#include <stdlib.h>

#include "frame.h"
#include "test.h"

static void le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

/* A frame built by hand, header bytes under the test's control. */
static size_t raw_frame(uint8_t *out, uint32_t len, uint8_t type, uint8_t flags, uint8_t r1,
			uint8_t r2, uint32_t id, const void *payload, size_t n)
{
	le32(out, len);
	out[4] = type;
	out[5] = flags;
	out[6] = r1;
	out[7] = r2;
	le32(out + 8, id);
	if (n)
		memcpy(out + 12, payload, n);
	return 12 + n;
}

static void test_roundtrip_fields(void)
{
	struct sbx_buf b = {0};
	size_t start;
	CHECK_EQ(sbx_frame_begin(&b, SBX_MSG_READY, 0xdeadbeef, &start), 0);
	CHECK_EQ(sbx_put_u8(&b, 0xab), 0);
	CHECK_EQ(sbx_put_u32(&b, 0x01020304), 0);
	CHECK_EQ(sbx_put_u64(&b, 0x1122334455667788ull), 0);
	CHECK_EQ(sbx_put_str(&b, "hello", 5), 0);
	CHECK_EQ(sbx_frame_end(&b, start, SBX_GUEST_FRAME_MAX), 0);
	CHECK_EQ(b.len, 12 + 1 + 4 + 8 + 4 + 5);
	CHECK_EQ(b.data[0], 22);
	CHECK_EQ(b.data[4], SBX_MSG_READY);
	CHECK_EQ(b.data[8], 0xef);

	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, b.data, b.len), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 1);
	CHECK_EQ(f.type, SBX_MSG_READY);
	CHECK_EQ(f.id, 0xdeadbeef);
	CHECK_EQ(f.payload_len, 22);
	struct sbx_cursor c = {f.payload, f.payload_len};
	uint8_t u8;
	uint32_t u32, n;
	uint64_t u64;
	const uint8_t *s;
	CHECK_EQ(sbx_get_u8(&c, &u8), 0);
	CHECK_EQ(u8, 0xab);
	CHECK_EQ(sbx_get_u32(&c, &u32), 0);
	CHECK_EQ(u32, 0x01020304);
	CHECK_EQ(sbx_get_u64(&c, &u64), 0);
	CHECK(u64 == 0x1122334455667788ull);
	CHECK_EQ(sbx_get_str(&c, 16, &s, &n), 0);
	CHECK_EQ(n, 5);
	CHECK(memcmp(s, "hello", 5) == 0);
	CHECK_EQ(c.left, 0);
	CHECK_EQ(sbx_get_u8(&c, &u8), -EPROTO);
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
}

static void test_empty_payload_and_many_frames(void)
{
	struct sbx_buf b = {0};
	size_t start;
	for (uint32_t i = 0; i < 100; i++) {
		CHECK_EQ(sbx_frame_begin(&b, SBX_MSG_PONG, i, &start), 0);
		CHECK_EQ(sbx_frame_end(&b, start, SBX_GUEST_FRAME_MAX), 0);
	}
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, b.data, b.len), 0);
	for (uint32_t i = 0; i < 100; i++) {
		CHECK_EQ(sbx_reader_next(&r, &f), 1);
		CHECK_EQ(f.id, i);
		CHECK_EQ(f.payload_len, 0);
	}
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
}

/* Reading straight into the reader (sbx_reader_space/commit) decodes the same frames as feeding
 * copies, across any split, and keeps feed's limit on what may wait. */
static void test_space_and_commit_decode_like_feed(void)
{
	struct sbx_buf b = {0};
	size_t start;
	static uint8_t payload[3000];
	for (uint32_t i = 0; i < 50; i++) {
		CHECK_EQ(sbx_frame_begin(&b, SBX_MSG_STDOUT, i, &start), 0);
		memset(payload, (int)i, sizeof(payload));
		CHECK_EQ(sbx_buf_append(&b, payload, i * 60), 0);
		CHECK_EQ(sbx_frame_end(&b, start, 4096), 0);
	}
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, 4096);
	uint32_t next_id = 0;
	for (size_t off = 0, step = 1; off < b.len; step = step * 7 % 4099 + 1) {
		size_t n = b.len - off < step ? b.len - off : step;
		uint8_t *at;
		CHECK_EQ(sbx_reader_space(&r, n, &at), 0);
		memcpy(at, b.data + off, n);
		sbx_reader_commit(&r, n);
		off += n;
		while (sbx_reader_next(&r, &f) == 1) {
			CHECK_EQ(f.id, next_id);
			CHECK_EQ(f.payload_len, next_id * 60);
			for (uint32_t k = 0; k < f.payload_len; k++)
				CHECK_EQ(f.payload[k], (uint8_t)next_id);
			next_id++;
		}
	}
	CHECK_EQ(next_id, 50);
	uint8_t *at;
	CHECK_EQ(sbx_reader_space(&r, 4096 + SBX_FRAME_HEADER_SIZE + 1, &at), -EMSGSIZE);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
}

static void test_truncated_input(void)
{
	uint8_t frame[64];
	size_t n = raw_frame(frame, 5, SBX_MSG_STDOUT, 0, 0, 0, 7, "abcde", 5);
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	CHECK_EQ(sbx_reader_feed(&r, frame, 11), 0); /* header incomplete */
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	CHECK_EQ(sbx_reader_feed(&r, frame + 11, 3), 0); /* payload incomplete */
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	CHECK_EQ(sbx_reader_feed(&r, frame + 14, n - 14), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 1);
	CHECK_EQ(f.id, 7);
	CHECK_EQ(f.payload_len, 5);
	CHECK(memcmp(f.payload, "abcde", 5) == 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	sbx_reader_free(&r);
}

static void test_byte_at_a_time(void)
{
	struct sbx_buf b = {0};
	size_t start;
	for (uint32_t i = 0; i < 10; i++) {
		CHECK_EQ(sbx_frame_begin(&b, SBX_MSG_STDERR, 1000 + i, &start), 0);
		for (uint32_t j = 0; j <= i; j++)
			CHECK_EQ(sbx_put_u8(&b, (uint8_t)('a' + j)), 0);
		CHECK_EQ(sbx_frame_end(&b, start, SBX_GUEST_FRAME_MAX), 0);
	}
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	uint32_t got = 0;
	for (size_t k = 0; k < b.len; k++) {
		CHECK_EQ(sbx_reader_feed(&r, b.data + k, 1), 0);
		int rc;
		while ((rc = sbx_reader_next(&r, &f)) == 1) {
			CHECK_EQ(f.id, 1000 + got);
			CHECK_EQ(f.payload_len, got + 1);
			CHECK_EQ(f.payload[got], 'a' + got);
			got++;
		}
		CHECK_EQ(rc, 0);
	}
	CHECK_EQ(got, 10);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
}

static void test_oversize_length(void)
{
	uint8_t hdr[12];
	struct sbx_reader r;
	struct sbx_frame f;
	/* Exactly the limit is fine (needs more bytes), one more is -EMSGSIZE, before any payload
	 * byte arrives and without allocating for it. */
	raw_frame(hdr, SBX_GUEST_FRAME_MAX, SBX_MSG_STDOUT, 0, 0, 0, 1, NULL, 0);
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, hdr, 12), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 0);
	sbx_reader_free(&r);

	raw_frame(hdr, SBX_GUEST_FRAME_MAX + 1, SBX_MSG_STDOUT, 0, 0, 0, 1, NULL, 0);
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, hdr, 12), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), -EMSGSIZE);
	/* Sticky. */
	CHECK_EQ(sbx_reader_next(&r, &f), -EMSGSIZE);
	CHECK_EQ(sbx_reader_feed(&r, hdr, 1), -EMSGSIZE);
	sbx_reader_free(&r);

	raw_frame(hdr, 0xffffffffu, SBX_MSG_STDOUT, 0, 0, 0, 1, NULL, 0);
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, hdr, 12), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), -EMSGSIZE);
	sbx_reader_free(&r);
}

static void test_max_payload_accepted(void)
{
	size_t n = 12 + SBX_GUEST_FRAME_MAX;
	uint8_t *buf = calloc(1, n);
	raw_frame(buf, SBX_GUEST_FRAME_MAX, SBX_MSG_STDOUT, 0, 0, 0, 9, NULL, 0);
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, buf, n), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 1);
	CHECK_EQ(f.payload_len, SBX_GUEST_FRAME_MAX);
	sbx_reader_free(&r);
	free(buf);
}

static void test_feed_over_buffer_limit(void)
{
	/* More than two maximal frames pending without draining: refused. */
	size_t lim = 12 + SBX_GUEST_FRAME_MAX;
	uint8_t *buf = calloc(1, lim + 1);
	struct sbx_reader r;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, buf, lim + 1), -EMSGSIZE);
	sbx_reader_free(&r);
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, buf, lim), 0);
	CHECK_EQ(sbx_reader_feed(&r, buf, lim), 0);
	CHECK_EQ(sbx_reader_feed(&r, buf, 1), -EMSGSIZE);
	sbx_reader_free(&r);
	free(buf);
}

static void test_nonzero_reserved(void)
{
	for (int which = 0; which < 3; which++) {
		uint8_t frame[16];
		size_t n = raw_frame(frame, 0, SBX_MSG_PONG, which == 0, which == 1, which == 2, 1,
				     NULL, 0);
		struct sbx_reader r;
		struct sbx_frame f;
		sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
		CHECK_EQ(sbx_reader_feed(&r, frame, n), 0);
		CHECK_EQ(sbx_reader_next(&r, &f), -EPROTO);
		CHECK_EQ(sbx_reader_next(&r, &f), -EPROTO);
		CHECK_EQ(sbx_reader_feed(&r, frame, n), -EPROTO);
		sbx_reader_free(&r);
	}
	/* 0x80 in the high reserved byte too. */
	uint8_t frame[16];
	size_t n = raw_frame(frame, 0, SBX_MSG_PONG, 0, 0, 0x80, 1, NULL, 0);
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, frame, n), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), -EPROTO);
	sbx_reader_free(&r);
}

static void test_frame_end_over_max(void)
{
	struct sbx_buf b = {0};
	size_t start;
	CHECK_EQ(sbx_frame_begin(&b, SBX_MSG_PONG, 1, &start), 0);
	CHECK_EQ(sbx_frame_end(&b, start, 0), 0);
	size_t keep = b.len;
	CHECK_EQ(sbx_frame_begin(&b, SBX_MSG_STDOUT, 2, &start), 0);
	CHECK_EQ(sbx_put_u32(&b, 1), 0);
	CHECK_EQ(sbx_frame_end(&b, start, 3), -EMSGSIZE);
	CHECK_EQ(b.len, keep); /* the failed frame is removed, the earlier one kept */
	sbx_buf_free(&b);
}

static void test_get_str_limits(void)
{
	uint8_t p[12];
	le32(p, 8);
	memcpy(p + 4, "abcdefgh", 8);
	struct sbx_cursor c = {p, sizeof(p)};
	const uint8_t *s;
	uint32_t n;
	CHECK_EQ(sbx_get_str(&c, 7, &s, &n), -EMSGSIZE);
	c = (struct sbx_cursor){p, sizeof(p) - 1};
	CHECK_EQ(sbx_get_str(&c, 8, &s, &n), -EPROTO);
	c = (struct sbx_cursor){p, sizeof(p)};
	CHECK_EQ(sbx_get_str(&c, 8, &s, &n), 0);
	CHECK_EQ(n, 8);
	c = (struct sbx_cursor){p, 3};
	CHECK_EQ(sbx_get_str(&c, 8, &s, &n), -EPROTO);
	uint64_t v;
	c = (struct sbx_cursor){p, 7};
	CHECK_EQ(sbx_get_u64(&c, &v), -EPROTO);
}

static int decode_exit_raw(int32_t code, uint32_t flags, uint64_t dur, uint32_t len, uint8_t type,
			   struct sbx_exit *out)
{
	uint8_t p[32] = {0};
	le32(p, (uint32_t)code);
	le32(p + 4, flags);
	le32(p + 8, (uint32_t)dur);
	le32(p + 12, (uint32_t)(dur >> 32));
	struct sbx_frame f = {.type = type, .id = 1, .payload = p, .payload_len = len};
	return sbx_decode_exit(&f, out);
}

static void test_exit_payload(void)
{
	struct sbx_exit e;
	CHECK_EQ(decode_exit_raw(0, 0, 1234, 16, SBX_MSG_EXIT, &e), 0);
	CHECK_EQ(e.exit_code, 0);
	CHECK_EQ(e.duration_us, 1234);
	CHECK_EQ(decode_exit_raw(-1, SBX_EXIT_TIMED_OUT, 5ull << 33, 16, SBX_MSG_EXIT, &e), 0);
	CHECK_EQ(e.exit_code, -1);
	CHECK_EQ(e.flags, SBX_EXIT_TIMED_OUT);
	CHECK(e.duration_us == 5ull << 33);
	CHECK_EQ(decode_exit_raw(255, SBX_EXIT_FLAGS_ALL, 0, 16, SBX_MSG_EXIT, &e), 0);
	CHECK_EQ(decode_exit_raw(137, SBX_EXIT_STDOUT_LIMIT, 0, 16, SBX_MSG_EXIT, &e), 0);
	/* Invalid codes. */
	CHECK_EQ(decode_exit_raw(256, 0, 0, 16, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(-2, 0, 0, 16, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(INT32_MIN, 0, 0, 16, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(INT32_MAX, 0, 0, 16, SBX_MSG_EXIT, &e), -EPROTO);
	/* Invalid flags. */
	CHECK_EQ(decode_exit_raw(0, 1u << 4, 0, 16, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(0, 0x80000000u, 0, 16, SBX_MSG_EXIT, &e), -EPROTO);
	/* Wrong length or type. */
	CHECK_EQ(decode_exit_raw(0, 0, 0, 15, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(0, 0, 0, 17, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(0, 0, 0, 0, SBX_MSG_EXIT, &e), -EPROTO);
	CHECK_EQ(decode_exit_raw(0, 0, 0, 16, SBX_MSG_STDOUT, &e), -EPROTO);
}

static void test_exit_roundtrip(void)
{
	struct sbx_buf b = {0};
	struct sbx_exit in = {.exit_code = 42, .flags = SBX_EXIT_STDERR_LIMIT, .duration_us = 987654321ull};
	CHECK_EQ(sbx_encode_exit(&b, 77, &in), 0);
	CHECK_EQ(b.len, 12 + SBX_EXIT_PAYLOAD_SIZE);
	struct sbx_reader r;
	struct sbx_frame f;
	struct sbx_exit out;
	sbx_reader_init(&r, SBX_GUEST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, b.data, b.len), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 1);
	CHECK_EQ(f.id, 77);
	CHECK_EQ(sbx_decode_exit(&f, &out), 0);
	CHECK_EQ(out.exit_code, 42);
	CHECK_EQ(out.flags, SBX_EXIT_STDERR_LIMIT);
	CHECK(out.duration_us == 987654321ull);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
}

static void test_buf_consume(void)
{
	struct sbx_buf b = {0};
	CHECK_EQ(sbx_buf_append(&b, "abcdef", 6), 0);
	sbx_buf_consume(&b, 2);
	CHECK_EQ(b.len, 4);
	CHECK(memcmp(b.data, "cdef", 4) == 0);
	sbx_buf_consume(&b, 10);
	CHECK_EQ(b.len, 0);
	CHECK_EQ(sbx_buf_append(&b, NULL, 0), 0);
	sbx_buf_free(&b);
	CHECK(b.data == NULL);
}

int main(void)
{
	RUN(test_roundtrip_fields);
	RUN(test_empty_payload_and_many_frames);
	RUN(test_truncated_input);
	RUN(test_byte_at_a_time);
	RUN(test_oversize_length);
	RUN(test_max_payload_accepted);
	RUN(test_feed_over_buffer_limit);
	RUN(test_nonzero_reserved);
	RUN(test_frame_end_over_max);
	RUN(test_get_str_limits);
	RUN(test_exit_payload);
	RUN(test_exit_roundtrip);
	RUN(test_buf_consume);
	RUN(test_space_and_commit_decode_like_feed);
	TEST_MAIN_END("test_frame");
}
