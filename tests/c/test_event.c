/* Unit tests of guest->host payload validation (event.c) and host->guest encoding (agent_request.c). */
#include <errno.h>
#include <stdlib.h>

#include "event.h"
#include "agent_request.h"
#include "net_protocol.h"
#include "test.h"

/* Where a test does not look at the explanation of an error. */
static struct sbx_err E;

struct payload {
	uint8_t b[SBX_GUEST_FRAME_MAX];
	size_t n;
};

static void p_u32(struct payload *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p->b[p->n++] = (uint8_t)(v >> (8 * i));
}

static void p_bytes(struct payload *p, const void *d, size_t n)
{
	memcpy(p->b + p->n, d, n);
	p->n += n;
}

static int decode(uint8_t type, const struct payload *p, struct sbx_event *ev)
{
	struct sbx_frame f = {.type = type, .id = 99, .payload = p->b, .payload_len = (uint32_t)p->n};
	return sbx_event_decode(&f, ev);
}

static struct payload P; /* large: not on the stack */

static void test_ready(void)
{
	struct sbx_event ev;
	P.n = 0;
	p_u32(&P, 1);
	p_u32(&P, 5);
	p_bytes(&P, "0.1.0", 5);
	CHECK_EQ(decode(SBX_MSG_READY, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_READY);
	CHECK_EQ(ev.id, 99);
	CHECK_EQ(ev.protocol_version, 1);
	CHECK_EQ(ev.len, 5);
	CHECK(memcmp(ev.data, "0.1.0", 5) == 0);
	CHECK_STR(sbx_event_kind_name(ev.kind), "ready");
	/* Trailing byte, short string, missing version, over-long version. */
	P.b[P.n++] = 0;
	CHECK_EQ(decode(SBX_MSG_READY, &P, &ev), -EPROTO);
	P.n -= 2;
	CHECK_EQ(decode(SBX_MSG_READY, &P, &ev), -EPROTO);
	P.n = 2;
	CHECK_EQ(decode(SBX_MSG_READY, &P, &ev), -EPROTO);
	P.n = 0;
	CHECK_EQ(decode(SBX_MSG_READY, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, 1);
	p_u32(&P, SBX_AGENT_VERSION_MAX + 1);
	memset(P.b + P.n, 'v', SBX_AGENT_VERSION_MAX + 1);
	P.n += SBX_AGENT_VERSION_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_READY, &P, &ev), -EMSGSIZE);
}

static void test_output(void)
{
	struct sbx_event ev;
	P.n = 0;
	p_bytes(&P, "hi\n", 3);
	CHECK_EQ(decode(SBX_MSG_STDOUT, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_STDOUT);
	CHECK_EQ(ev.len, 3);
	CHECK_EQ(decode(SBX_MSG_STDERR, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_STDERR);
	P.n = 0;
	CHECK_EQ(decode(SBX_MSG_STDOUT, &P, &ev), -EPROTO); /* empty chunk */
	P.n = SBX_OUTPUT_CHUNK_MAX;
	CHECK_EQ(decode(SBX_MSG_STDOUT, &P, &ev), 0);
	P.n = SBX_OUTPUT_CHUNK_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_STDERR, &P, &ev), -EPROTO);
}

static void test_exit(void)
{
	struct sbx_event ev;
	P.n = 0;
	p_u32(&P, (uint32_t)-1);
	p_u32(&P, SBX_EXIT_TIMED_OUT);
	p_u32(&P, 10);
	p_u32(&P, 1);
	CHECK_EQ(decode(SBX_MSG_EXIT, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_EXIT);
	CHECK_EQ(ev.exit.exit_code, -1);
	CHECK_EQ(ev.exit.flags, SBX_EXIT_TIMED_OUT);
	CHECK(ev.exit.duration_us == ((1ull << 32) | 10));
	P.b[4] = 16; /* unknown flag */
	CHECK_EQ(decode(SBX_MSG_EXIT, &P, &ev), -EPROTO);
	P.b[4] = 0;
	P.n = 17;
	CHECK_EQ(decode(SBX_MSG_EXIT, &P, &ev), -EPROTO);
}

static void test_error(void)
{
	struct sbx_event ev;
	P.n = 0;
	p_u32(&P, SBX_ERR_BUSY);
	p_u32(&P, 4);
	p_bytes(&P, "busy", 4);
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_ERROR);
	CHECK_EQ(ev.error_code, SBX_ERR_BUSY);
	CHECK_EQ(ev.len, 4);
	P.b[0] = 0;
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), -EPROTO);
	P.b[0] = SBX_ERR_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), -EPROTO);
	/* The process errors of protocol v5 are codes like the others. */
	P.b[0] = SBX_ERR_NO_PROCESS;
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), 0);
	P.b[0] = SBX_ERR_LIMIT;
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), 0);
	CHECK_EQ(ev.error_code, SBX_ERR_LIMIT);
	P.b[0] = SBX_ERR_SPAWN;
	P.n--;
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, SBX_ERR_INTERNAL);
	p_u32(&P, SBX_ERROR_MESSAGE_MAX + 1);
	P.n += SBX_ERROR_MESSAGE_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), -EMSGSIZE);
	P.n = 0;
	p_u32(&P, SBX_ERR_INTERNAL);
	p_u32(&P, 0);
	CHECK_EQ(decode(SBX_MSG_ERROR, &P, &ev), 0);
	CHECK_EQ(ev.len, 0);
}

static void test_pong_and_bad_types(void)
{
	struct sbx_event ev;
	P.n = 0;
	CHECK_EQ(decode(SBX_MSG_PONG, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_PONG);
	P.n = 1;
	CHECK_EQ(decode(SBX_MSG_PONG, &P, &ev), -EPROTO);
	P.n = 0;
	static const uint8_t bad[] = {0, 15, 31, 63, SBX_MSG_EXEC, SBX_MSG_PING, SBX_MSG_SESSION_EXEC,
					   SBX_MSG_FILE_READ, SBX_MSG_TOOL_RESULT, 255};
	for (size_t i = 0; i < sizeof(bad); i++)
		CHECK_EQ(decode(bad[i], &P, &ev), -EPROTO);
}

static void test_reseeded(void)
{
	struct sbx_event ev;
	P.n = 0;
	CHECK_EQ(decode(SBX_MSG_RESEEDED, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_RESEEDED);
	CHECK_EQ(ev.id, 99);
	CHECK_STR(sbx_event_kind_name(ev.kind), "reseeded");
	P.n = 1; /* RESEEDED is empty: a payload is a violation */
	CHECK_EQ(decode(SBX_MSG_RESEEDED, &P, &ev), -EPROTO);
	P.n = 0;
	/* The host -> guest RESEED is never accepted from the guest. */
	CHECK_EQ(decode(SBX_MSG_RESEED, &P, &ev), -EPROTO);
}

static void test_reseed_encoding(void)
{
	struct sbx_buf b = {0};
	uint8_t seed[SBX_RESEED_BYTES];
	for (size_t i = 0; i < sizeof(seed); i++)
		seed[i] = (uint8_t)(i * 7 + 1);
	CHECK_EQ(sbx_encode_reseed(&b, 5, seed, sizeof(seed) - 1, 0, &E), -EINVAL);
	CHECK_EQ(b.len, 0);
	CHECK_EQ(sbx_encode_reseed(&b, 5, seed, sizeof(seed), 0x0102030405060708ull, &E), 0);
	CHECK_EQ(b.len, SBX_FRAME_HEADER_SIZE + SBX_RESEED_PAYLOAD_SIZE);
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_HOST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, b.data, b.len), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 1);
	CHECK_EQ(f.type, SBX_MSG_RESEED);
	CHECK_EQ(f.id, 5);
	CHECK_EQ(f.payload_len, SBX_RESEED_PAYLOAD_SIZE);
	CHECK(memcmp(f.payload, seed, sizeof(seed)) == 0);
	struct sbx_cursor c = {f.payload + SBX_RESEED_BYTES, 8};
	uint64_t ns = 0;
	CHECK_EQ(sbx_get_u64(&c, &ns), 0);
	CHECK(ns == 0x0102030405060708ull);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
}

static void test_prestart_encoding(void)
{
	struct sbx_buf b = {0};
	/* Only known languages; nothing is left half-written. */
	CHECK_EQ(sbx_encode_prestart(&b, 6, SBX_LANG_RAW + 1, &E), -EINVAL);
	CHECK_EQ(sbx_encode_prestart(&b, 6, 0, &E), -EINVAL);
	CHECK_EQ(b.len, 0);
	CHECK_EQ(sbx_encode_prestart(&b, 6, SBX_LANG_JAVASCRIPT, &E), 0);
	CHECK_EQ(b.len, SBX_FRAME_HEADER_SIZE + 1);
	struct sbx_reader r;
	struct sbx_frame f;
	sbx_reader_init(&r, SBX_HOST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&r, b.data, b.len), 0);
	CHECK_EQ(sbx_reader_next(&r, &f), 1);
	CHECK_EQ(f.type, SBX_MSG_PRESTART);
	CHECK_EQ(f.id, 6);
	CHECK_EQ(f.payload_len, 1);
	CHECK_EQ(f.payload[0], SBX_LANG_JAVASCRIPT);
	sbx_reader_free(&r);
	sbx_buf_free(&b);
	/* The host -> guest PRESTART is never accepted from the guest. */
	P.n = 1;
	P.b[0] = SBX_LANG_PYTHON;
	struct sbx_event ev;
	CHECK_EQ(decode(SBX_MSG_PRESTART, &P, &ev), -EPROTO);
}

static void p_entry(struct payload *p, uint8_t is_dir, uint64_t size, const char *name)
{
	p->b[p->n++] = is_dir;
	p_u32(p, (uint32_t)size);
	p_u32(p, (uint32_t)(size >> 32));
	p_u32(p, (uint32_t)strlen(name));
	p_bytes(p, name, strlen(name));
}

static void test_file_data_and_done(void)
{
	struct sbx_event ev;
	P.n = 0;
	CHECK_EQ(decode(SBX_MSG_FILE_DATA, &P, &ev), -EPROTO); /* empty */
	P.n = SBX_FILE_CHUNK_MAX;
	CHECK_EQ(decode(SBX_MSG_FILE_DATA, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_FILE_DATA);
	CHECK_EQ(ev.len, SBX_FILE_CHUNK_MAX);
	CHECK_STR(sbx_event_kind_name(ev.kind), "file_data");
	P.n = SBX_FILE_CHUNK_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_FILE_DATA, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, 7);
	p_u32(&P, 1);
	CHECK_EQ(decode(SBX_MSG_FILE_DONE, &P, &ev), 0);
	CHECK_EQ(ev.value, (1ull << 32) + 7);
	P.n = 7;
	CHECK_EQ(decode(SBX_MSG_FILE_DONE, &P, &ev), -EPROTO);
	P.n = 9;
	CHECK_EQ(decode(SBX_MSG_FILE_DONE, &P, &ev), -EPROTO);
	/* FILE_ERROR: kind in range, message bounded. */
	P.n = 0;
	p_u32(&P, SBX_FILE_ERR_NOT_FOUND);
	p_u32(&P, 4);
	p_bytes(&P, "gone", 4);
	CHECK_EQ(decode(SBX_MSG_FILE_ERROR, &P, &ev), 0);
	CHECK_EQ(ev.error_code, SBX_FILE_ERR_NOT_FOUND);
	CHECK_EQ(ev.len, 4);
	P.b[0] = 0;
	CHECK_EQ(decode(SBX_MSG_FILE_ERROR, &P, &ev), -EPROTO);
	P.b[0] = SBX_FILE_ERR_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_FILE_ERROR, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, SBX_FILE_ERR_IO);
	p_u32(&P, SBX_ERROR_MESSAGE_MAX + 1);
	P.n += SBX_ERROR_MESSAGE_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_FILE_ERROR, &P, &ev), -EMSGSIZE);
}

static void test_file_entries(void)
{
	struct sbx_event ev;
	P.n = 0;
	p_u32(&P, 2);
	p_entry(&P, 1, 4096, "dir");
	p_entry(&P, 0, 5000000000ull, "big.bin");
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_FILE_ENTRIES);
	CHECK_EQ(ev.count, 2);
	struct sbx_cursor c = {ev.data, ev.len};
	struct sbx_dir_entry e;
	CHECK_EQ(sbx_dir_entry_next(&c, &e), 0);
	CHECK(e.is_dir == 1 && e.size == 4096 && e.name_len == 3 && memcmp(e.name, "dir", 3) == 0);
	CHECK_EQ(sbx_dir_entry_next(&c, &e), 0);
	CHECK(e.is_dir == 0 && e.size == 5000000000ull && e.name_len == 7);
	CHECK_EQ(c.left, 0);
	/* The count must match the entries exactly. */
	P.b[0] = 3;
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EPROTO);
	P.b[0] = 1;
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EPROTO); /* trailing entry */
	P.b[0] = 0;
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EPROTO); /* empty batch */
	/* Bad names and flags. */
	static const char *const bad_names[] = {"", ".", "..", "a/b", "nul\0x"};
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		P.n = 0;
		p_u32(&P, 1);
		size_t len = i == 4 ? 5 : strlen(bad_names[i]);
		P.b[P.n++] = 0;
		p_u32(&P, 1);
		p_u32(&P, 0);
		p_u32(&P, (uint32_t)len);
		p_bytes(&P, bad_names[i], len);
		CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EPROTO);
	}
	P.n = 0;
	p_u32(&P, 1);
	p_entry(&P, 2, 1, "x");
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, 1);
	P.b[P.n++] = 0;
	p_u32(&P, 1);
	p_u32(&P, 0);
	p_u32(&P, SBX_PATH_COMPONENT_MAX + 1);
	memset(P.b + P.n, 'n', SBX_PATH_COMPONENT_MAX + 1);
	P.n += SBX_PATH_COMPONENT_MAX + 1;
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EMSGSIZE);
	/* More entries than a batch may hold. */
	P.n = 0;
	p_u32(&P, SBX_LIST_BATCH_MAX + 1);
	for (uint32_t i = 0; i < SBX_LIST_BATCH_MAX + 1; i++)
		p_entry(&P, 0, 1, "f");
	CHECK_EQ(decode(SBX_MSG_FILE_ENTRIES, &P, &ev), -EPROTO);
}

static void p_str(struct payload *p, const char *s)
{
	p_u32(p, (uint32_t)strlen(s));
	p_bytes(p, s, strlen(s));
}

/* A TOOL_CALL payload: call, name, arguments. */
static void tool_call(uint32_t call, const char *name, const char *args)
{
	P.n = 0;
	p_u32(&P, call);
	p_str(&P, name);
	p_str(&P, args);
}

static void test_tool_call(void)
{
	struct sbx_event ev;
	tool_call(3, "get_weather", "{\"args\": [\"Paris\"], \"kwargs\": {}}");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_TOOL_CALL);
	CHECK_STR(sbx_event_kind_name(ev.kind), "tool_call");
	CHECK_EQ(ev.id, 99);
	CHECK_EQ(ev.call, 3);
	CHECK(ev.name_len == 11 && memcmp(ev.name, "get_weather", 11) == 0);
	CHECK(ev.len == 33 && memcmp(ev.data, "{\"args\": [\"Paris\"]", 18) == 0);
	/* The name's whole alphabet, a leading underscore, one letter; the highest call. */
	tool_call(UINT32_MAX, "_Az09_", "{}");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), 0);
	CHECK_EQ(ev.call, UINT32_MAX);
	tool_call(1, "x", "1");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), 0);

	/* Both limits exactly: a name of 64, arguments of 60 KiB (still one guest frame). */
	char name[SBX_TOOL_NAME_MAX + 2];
	memset(name, 'n', sizeof(name) - 1);
	name[SBX_TOOL_NAME_MAX] = '\0';
	P.n = 0;
	p_u32(&P, 7);
	p_str(&P, name);
	p_u32(&P, SBX_TOOL_ARGS_MAX);
	memset(P.b + P.n, ' ', SBX_TOOL_ARGS_MAX);
	P.n += SBX_TOOL_ARGS_MAX;
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), 0);
	CHECK_EQ(ev.name_len, SBX_TOOL_NAME_MAX);
	CHECK_EQ(ev.len, SBX_TOOL_ARGS_MAX);
	/* One byte more of arguments, one more of name: over their limits. */
	P.b[4 + 4 + SBX_TOOL_NAME_MAX] = (uint8_t)((SBX_TOOL_ARGS_MAX + 1) & 0xff);
	P.b[4 + 4 + SBX_TOOL_NAME_MAX + 1] = (uint8_t)((SBX_TOOL_ARGS_MAX + 1) >> 8);
	P.b[P.n++] = ' ';
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EMSGSIZE);
	name[SBX_TOOL_NAME_MAX] = 'n';
	name[SBX_TOOL_NAME_MAX + 1] = '\0';
	tool_call(7, name, "{}");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EMSGSIZE);

	/* Call 0, empty name or arguments, names that are no identifiers. */
	tool_call(0, "f", "{}");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);
	tool_call(1, "", "{}");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);
	tool_call(1, "f", "");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);
	static const char *const bad_names[] = {"9lives", "a-b", "a.b", "a b", "a/b", "f\n", "é",
						 "f()", "$x", "x\x7f"};
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		tool_call(1, bad_names[i], "{}");
		CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);
	}
	P.n = 0; /* a NUL inside the name */
	p_u32(&P, 1);
	p_u32(&P, 3);
	p_bytes(&P, "a\0b", 3);
	p_str(&P, "{}");
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);

	/* Trailing bytes; every truncation. */
	tool_call(2, "f", "{}");
	size_t full = P.n;
	P.b[P.n++] = 0;
	CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);
	for (P.n = 0; P.n < full; P.n++)
		CHECK_EQ(decode(SBX_MSG_TOOL_CALL, &P, &ev), -EPROTO);
}

/* An OUTPUT payload: flags, the mime type with BEGIN (NULL: none), then n bytes of data. */
static void output(uint8_t flags, const char *mime, size_t n)
{
	P.n = 0;
	P.b[P.n++] = flags;
	if (mime)
		p_str(&P, mime);
	memset(P.b + P.n, 'd', n);
	P.n += n;
}

static void test_rich_output(void)
{
	struct sbx_event ev;
	/* A whole output in one frame. */
	output(SBX_OUTPUT_BEGIN | SBX_OUTPUT_END, "image/png", 5);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_OUTPUT);
	CHECK_STR(sbx_event_kind_name(ev.kind), "output");
	CHECK_EQ(ev.id, 99);
	CHECK_EQ(ev.flags, SBX_OUTPUT_BEGIN | SBX_OUTPUT_END);
	CHECK(ev.name_len == 9 && memcmp(ev.name, "image/png", 9) == 0);
	CHECK(ev.len == 5 && memcmp(ev.data, "ddddd", 5) == 0);
	/* An empty output, then the three frames of a long one: BEGIN, middle, END. */
	output(SBX_OUTPUT_BEGIN | SBX_OUTPUT_END, "text/plain", 0);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.len, 0);
	output(SBX_OUTPUT_BEGIN, "application/vnd.plotly.v1+json", SBX_OUTPUT_DATA_MAX);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.flags, SBX_OUTPUT_BEGIN);
	CHECK_EQ(ev.name_len, 30);
	CHECK_EQ(ev.len, SBX_OUTPUT_DATA_MAX);
	output(0, NULL, SBX_OUTPUT_DATA_MAX);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.flags, 0);
	CHECK(ev.name == NULL && ev.name_len == 0);
	CHECK_EQ(ev.len, SBX_OUTPUT_DATA_MAX);
	output(SBX_OUTPUT_END, NULL, 1);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.flags, SBX_OUTPUT_END);
	CHECK_EQ(ev.name_len, 0);
	CHECK(ev.len == 1 && ev.data[0] == 'd');
	/* Every character the type may hold; the longest type. */
	output(SBX_OUTPUT_BEGIN, "a-b.c+d_e/0-9.z+y_x", 0);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	char mime[SBX_MIME_TYPE_MAX + 2];
	memset(mime, 'm', sizeof(mime) - 1);
	mime[1] = '/';
	mime[SBX_MIME_TYPE_MAX] = '\0';
	output(SBX_OUTPUT_BEGIN, mime, 1);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.name_len, SBX_MIME_TYPE_MAX);

	/* Over the limits: a type of 128, data of 60 KiB + 1 (with and without BEGIN). */
	mime[SBX_MIME_TYPE_MAX] = 'm';
	mime[SBX_MIME_TYPE_MAX + 1] = '\0';
	output(SBX_OUTPUT_BEGIN, mime, 1);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EMSGSIZE);
	output(SBX_OUTPUT_BEGIN | SBX_OUTPUT_END, "image/png", SBX_OUTPUT_DATA_MAX + 1);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);
	output(SBX_OUTPUT_END, NULL, SBX_OUTPUT_DATA_MAX + 1);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);

	/* Unknown flag bits, alone or beside the known ones. */
	static const uint8_t bad_flags[] = {4, 8, 0x80, SBX_OUTPUT_END | 4, 0xff};
	for (size_t i = 0; i < sizeof(bad_flags); i++) {
		output(bad_flags[i], (bad_flags[i] & SBX_OUTPUT_BEGIN) ? "text/plain" : NULL, 1);
		CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);
	}
	/* Types that are not type/subtype in the narrow alphabet. */
	static const char *const bad_types[] = {
		"",           "text",       "text/",          "/plain",   "/",
		"text/html/x", "text//html", "Text/html",      "text/HTML", "text/plain; charset=utf-8",
		"text/pl ain", "text/pl\tain", "text/plain\n", "te\\xt/a",  "text/é",
		"image/svg+xml\x7f"};
	for (size_t i = 0; i < sizeof(bad_types) / sizeof(bad_types[0]); i++) {
		output(SBX_OUTPUT_BEGIN | SBX_OUTPUT_END, bad_types[i], 1);
		CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);
	}
	P.n = 0; /* a NUL inside the type */
	P.b[P.n++] = SBX_OUTPUT_BEGIN;
	p_u32(&P, 5);
	p_bytes(&P, "a/b\0c", 5);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);

	/* Empty payload (no flags); BEGIN with a cut-off type (these are the only ways to have
	 * "trailing" bytes: everything after the type is data). */
	P.n = 0;
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);
	output(SBX_OUTPUT_BEGIN, "text/plain", 0);
	size_t full = P.n;
	for (P.n = 1; P.n < full; P.n++)
		CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), -EPROTO);
	/* Without BEGIN there is no type: bytes that look like one are data. */
	output(SBX_OUTPUT_END, "text/plain", 0);
	CHECK_EQ(decode(SBX_MSG_OUTPUT, &P, &ev), 0);
	CHECK_EQ(ev.name_len, 0);
	CHECK_EQ(ev.len, 14);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The bytes of one encoded frame after its header must be want[0..n). */
static void check_payload(const struct sbx_buf *b, uint8_t type, uint32_t id, const char *want,
			  size_t n)
{
	CHECK_EQ(b->len, SBX_FRAME_HEADER_SIZE + n);
	if (b->len != SBX_FRAME_HEADER_SIZE + n)
		return;
	CHECK_EQ(b->data[4], type);
	CHECK_EQ(le32(b->data + 8), id);
	CHECK_EQ(le32(b->data), n);
	CHECK(memcmp(b->data + SBX_FRAME_HEADER_SIZE, want, n) == 0);
}

/* Each FILE_* request in the layout of protocol.h, byte for byte (what the guest parses). */
static void test_file_request_encoding(void)
{
	struct sbx_buf b = {0};
	struct sbx_err why = {0};
	struct sbx_file_req r = {.type = SBX_MSG_FILE_WRITE_BEGIN, .id = 5,
				 .path = (const uint8_t *)"d/x", .path_len = 3,
				 .flag = SBX_FILE_EXECUTABLE};
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_WRITE_BEGIN, 5, "\3\0\0\0d/x\1", 8);
	b.len = 0;
	r = (struct sbx_file_req){.type = SBX_MSG_FILE_WRITE_DATA, .id = 6,
				  .data = (const uint8_t *)"abc", .data_len = 3};
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_WRITE_DATA, 6, "abc", 3);
	b.len = 0;
	r = (struct sbx_file_req){.type = SBX_MSG_FILE_WRITE_DATA, .id = 6}; /* empty is fine */
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_WRITE_DATA, 6, "", 0);
	b.len = 0;
	r = (struct sbx_file_req){.type = SBX_MSG_FILE_WRITE_END, .id = 7, .flag = 1};
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_WRITE_END, 7, "\1", 1);
	b.len = 0;
	r = (struct sbx_file_req){.type = SBX_MSG_FILE_READ, .id = 8,
				  .path = (const uint8_t *)"a.txt", .path_len = 5};
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_READ, 8, "\5\0\0\0a.txt\0", 10);
	b.len = 0;
	/* Node's startup snapshot: named by its flag, with an empty path, both ways. */
	r = (struct sbx_file_req){.type = SBX_MSG_FILE_READ, .id = 10,
				  .flag = SBX_FILE_NODE_SNAPSHOT};
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_READ, 10, "\0\0\0\0\2", 5);
	b.len = 0;
	r.type = SBX_MSG_FILE_WRITE_BEGIN;
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_WRITE_BEGIN, 10, "\0\0\0\0\2", 5);
	b.len = 0;
	r = (struct sbx_file_req){.type = SBX_MSG_FILE_LIST, .id = 9}; /* "" = the home */
	CHECK_EQ(sbx_encode_file_request(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_FILE_LIST, 9, "\0\0\0\0", 4);
	sbx_buf_free(&b);
}

/* What the guest would refuse is refused here, with a reason, and leaves the buffer as it was. */
static void test_file_request_limits(void)
{
	static uint8_t big[SBX_PATH_MAX + 1];
	memset(big, 'a', sizeof(big));
	struct sbx_buf b = {0};
	CHECK_EQ(sbx_encode_ping(&b, 1, &E), 0);
	size_t before = b.len;
	struct sbx_err why = {0};
	struct {
		struct sbx_file_req r;
		int err;
		const char *msg;
	} bad[] = {
		{{.type = SBX_MSG_EXEC}, -EINVAL, "not a file-transfer message type"},
		{{.type = SBX_MSG_FILE_DATA}, -EINVAL, "not a file-transfer message type"},
		{{.type = SBX_MSG_FILE_WRITE_BEGIN, .path = big, .path_len = 1, .flag = 4}, -EINVAL,
		 "unknown file flag"},
		{{.type = SBX_MSG_FILE_READ, .path = big, .path_len = 1, .flag = SBX_FILE_EXECUTABLE},
		 -EINVAL, "unknown file flag"},
		{{.type = SBX_MSG_FILE_WRITE_BEGIN, .path = big, .path_len = 1,
		  .flag = SBX_FILE_NODE_SNAPSHOT},
		 -EINVAL, "node's startup snapshot takes no path and no other flag"},
		{{.type = SBX_MSG_FILE_WRITE_BEGIN, .flag = SBX_FILE_NODE_SNAPSHOT | SBX_FILE_EXECUTABLE},
		 -EINVAL, "node's startup snapshot takes no path and no other flag"},
		{{.type = SBX_MSG_FILE_WRITE_END, .flag = 2}, -EINVAL,
		 "FILE_WRITE_END is commit (1) or abort (0)"},
		{{.type = SBX_MSG_FILE_WRITE_DATA, .data = big, .data_len = SBX_HOST_FRAME_MAX + 1},
		 -EMSGSIZE, "payload larger than HOST_FRAME_MAX"},
		{{.type = SBX_MSG_FILE_READ, .path = big, .path_len = SBX_PATH_MAX + 1}, -EMSGSIZE,
		 "path longer than PATH_MAX"},
		{{.type = SBX_MSG_FILE_READ, .path = big, .path_len = 0}, -EINVAL, "empty path"},
		{{.type = SBX_MSG_FILE_WRITE_BEGIN, .path = (const uint8_t *)"a\0b", .path_len = 3},
		 -EINVAL, "path contains NUL"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sbx_err_clear(&why);
		CHECK_EQ(sbx_encode_file_request(&b, &bad[i].r, &why), bad[i].err);
		CHECK_STR(why.msg, bad[i].msg);
		CHECK_EQ(b.len, before);
	}
	/* PATH_MAX itself is fine. */
	struct sbx_file_req ok = {.type = SBX_MSG_FILE_LIST, .path = big, .path_len = SBX_PATH_MAX};
	CHECK_EQ(sbx_encode_file_request(&b, &ok, &why), 0);
	sbx_buf_free(&b);
}

/* TOOL_RESULT in the layout of protocol.h, byte for byte (what the guest parses). */
static void test_tool_result_encoding(void)
{
	struct sbx_buf b = {0};
	struct sbx_err why = {0};
	struct sbx_tool_result_req r = {.id = 40, .call = 0x01020304, .status = SBX_TOOL_OK,
					.body = (const uint8_t *)"[1, 2]", .body_len = 6};
	CHECK_EQ(sbx_encode_tool_result(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_TOOL_RESULT, 40, "\4\3\2\1\0\6\0\0\0[1, 2]", 15);
	b.len = 0;
	r = (struct sbx_tool_result_req){.id = 41, .call = 1, .status = SBX_TOOL_ERROR};
	CHECK_EQ(sbx_encode_tool_result(&b, &r, &why), 0); /* an empty message is fine */
	check_payload(&b, SBX_MSG_TOOL_RESULT, 41, "\1\0\0\0\1\0\0\0\0", 9);
	b.len = 0;
	/* The largest body: still one host frame the guest reads. */
	uint8_t *big = malloc(SBX_TOOL_RESULT_MAX + 1);
	memset(big, 'r', SBX_TOOL_RESULT_MAX + 1);
	r = (struct sbx_tool_result_req){.id = 42, .call = 9, .body = big,
					 .body_len = SBX_TOOL_RESULT_MAX};
	CHECK_EQ(sbx_encode_tool_result(&b, &r, &why), 0);
	CHECK_EQ(b.len, SBX_FRAME_HEADER_SIZE + 9 + SBX_TOOL_RESULT_MAX);
	struct sbx_reader rd;
	struct sbx_frame f;
	sbx_reader_init(&rd, SBX_HOST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&rd, b.data, b.len), 0);
	CHECK_EQ(sbx_reader_next(&rd, &f), 1);
	CHECK_EQ(f.type, SBX_MSG_TOOL_RESULT);
	CHECK_EQ(f.payload_len, 9 + SBX_TOOL_RESULT_MAX);
	sbx_reader_free(&rd);

	/* Refused with a reason, the buffer as it was: call 0, REFUSED (the agent's alone) or any
	 * other status, one byte over the limit. */
	size_t before = b.len;
	struct {
		struct sbx_tool_result_req r;
		int err;
		const char *msg;
	} bad[] = {
		{{.id = 1, .call = 0}, -EINVAL, "call 0 is no tool call"},
		{{.id = 1, .call = 1, .status = SBX_TOOL_REFUSED}, -EINVAL,
		 "tool status 2 is neither 0 (ok) nor 1 (error)"},
		{{.id = 1, .call = 1, .status = 256}, -EINVAL,
		 "tool status 256 is neither 0 (ok) nor 1 (error)"},
		{{.id = 1, .call = 1, .body = big, .body_len = SBX_TOOL_RESULT_MAX + 1}, -EMSGSIZE,
		 "tool result over 1 MiB (1048577 bytes)"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sbx_err_clear(&why);
		CHECK_EQ(sbx_encode_tool_result(&b, &bad[i].r, &why), bad[i].err);
		CHECK_STR(why.msg, bad[i].msg);
		CHECK_EQ(why.syscall, 0);
		CHECK_EQ(b.len, before);
	}
	free(big);
	sbx_buf_free(&b);
	/* The host -> guest TOOL_RESULT is never accepted from the guest. */
	P.n = 0;
	p_u32(&P, 1);
	P.b[P.n++] = 0;
	p_str(&P, "{}");
	struct sbx_event ev;
	CHECK_EQ(decode(SBX_MSG_TOOL_RESULT, &P, &ev), -EPROTO);
}

/* NET_CONFIG in the layout of net_protocol.h, byte for byte (what the guest parses). */
static void test_net_config_encoding(void)
{
	struct sbx_buf b = {0};
	struct sbx_err why = {0};
	const struct sbx_bytes names[] = {{(const uint8_t *)"a.example", 9},
					  {(const uint8_t *)"b-2.example", 11}};
	const uint32_t ports[] = {8443, 65535};
	struct sbx_net_config_req r = {.id = 900, .outbound = 1, .names = names, .name_count = 2,
				       .ports = ports, .port_count = 2,
				       .ca_bundle = (const uint8_t *)"PEM", .ca_len = 3};
	CHECK_EQ(sbx_encode_net_config(&b, &r, &why), 0);
	static const char want[] = "\1\0\0\0"                  /* flags: OUTBOUND */
				   "\2\0\0\0"                  /* two names */
				   "\11\0\0\0a.example"
				   "\13\0\0\0b-2.example"
				   "\2\0\0\0"                  /* two extra ports */
				   "\xfb\x20\0\0\xff\xff\0\0"  /* 8443, 65535 */
				   "\3\0\0\0PEM";              /* the CA bundle */
	check_payload(&b, SBX_MSG_NET_CONFIG, 900, want, sizeof(want) - 1);
	/* No outbound ("exposed ports only"), nothing else: flags 0 and three empty fields. */
	b.len = 0;
	r = (struct sbx_net_config_req){.id = 901};
	CHECK_EQ(sbx_encode_net_config(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_NET_CONFIG, 901, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
	/* "*" alone: every name. */
	b.len = 0;
	const struct sbx_bytes any = {(const uint8_t *)"*", 1};
	r = (struct sbx_net_config_req){.id = 902, .outbound = 1, .names = &any, .name_count = 1};
	CHECK_EQ(sbx_encode_net_config(&b, &r, &why), 0);
	check_payload(&b, SBX_MSG_NET_CONFIG, 902, "\1\0\0\0\1\0\0\0\1\0\0\0*\0\0\0\0\0\0\0\0", 21);
	sbx_buf_free(&b);
}

/* Each limit of net_protocol.h is refused one past it (with a reason, the buffer as it was) and
 * taken at it; so is what the guest would refuse as a pattern, a port or a bundle. */
static void test_net_config_limits(void)
{
	static uint8_t ca[SBX_NET_CA_BUNDLE_MAX + 1];
	static struct sbx_bytes names[SBX_NET_NAMES_MAX + 1];
	static uint8_t longest[SBX_NET_NAME_MAX + 1]; /* 63.63.63.61: a valid name of 253 bytes */
	memset(ca, 'P', sizeof(ca));
	memset(longest, 'a', sizeof(longest));
	longest[63] = longest[127] = longest[191] = '.';
	uint32_t ports[SBX_NET_EXTRA_PORTS_MAX + 1];
	for (size_t i = 0; i < sizeof(ports) / sizeof(ports[0]); i++)
		ports[i] = 1000 + (uint32_t)i;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		names[i] = (struct sbx_bytes){longest, SBX_NET_NAME_MAX};

	struct sbx_buf b = {0};
	CHECK_EQ(sbx_encode_ping(&b, 1, &E), 0);
	size_t before = b.len;
	struct sbx_err why = {0};
	/* At every limit at once: accepted, and still a frame the channel takes. */
	struct sbx_net_config_req full = {.id = 1, .outbound = 1, .names = names,
					  .name_count = SBX_NET_NAMES_MAX, .ports = ports,
					  .port_count = SBX_NET_EXTRA_PORTS_MAX, .ca_bundle = ca,
					  .ca_len = SBX_NET_CA_BUNDLE_MAX};
	CHECK_EQ(sbx_encode_net_config(&b, &full, &why), 0);
	CHECK(b.len > before && b.len - before <= SBX_FRAME_HEADER_SIZE + SBX_HOST_FRAME_MAX);
	b.len = before;

	static const struct {
		const char *name; /* NULL: the longest name, one byte longer */
		int err;
		const char *msg;
	} bad_names[] = {
		{NULL, -EMSGSIZE, "name 0 longer than 253 bytes"},
		{"", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"Example.org", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"-a.example", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"a-.example", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"a..example", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"example.org.", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"*.example.org", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"a_b.example", -EINVAL, "name 0 is not a lowercase DNS name or \"*\""},
		{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.org", -EINVAL,
		 "name 0 is not a lowercase DNS name or \"*\""}, /* a label of 64 */
	};
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		struct sbx_bytes n = bad_names[i].name
					     ? (struct sbx_bytes){(const uint8_t *)bad_names[i].name,
								  strlen(bad_names[i].name)}
					     : (struct sbx_bytes){longest, SBX_NET_NAME_MAX + 1};
		struct sbx_net_config_req r = {.id = 2, .outbound = 1, .names = &n, .name_count = 1};
		sbx_err_clear(&why);
		CHECK_EQ(sbx_encode_net_config(&b, &r, &why), bad_names[i].err);
		CHECK_STR(why.msg, bad_names[i].msg);
		CHECK_EQ(b.len, before);
	}
	const uint8_t nul_ca[] = "PEM\0PEM";
	const uint32_t port0 = 0, port_big = 65536;
	struct {
		struct sbx_net_config_req r;
		int err;
		const char *msg;
	} bad[] = {
		{{.names = names, .name_count = SBX_NET_NAMES_MAX + 1}, -EMSGSIZE, "more than 256 names"},
		{{.ports = ports, .port_count = SBX_NET_EXTRA_PORTS_MAX + 1}, -EMSGSIZE,
		 "more than 16 extra ports"},
		{{.ports = &port0, .port_count = 1}, -EINVAL, "port 0 outside 1..65535"},
		{{.ports = &port_big, .port_count = 1}, -EINVAL, "port 65536 outside 1..65535"},
		{{.ca_bundle = ca, .ca_len = SBX_NET_CA_BUNDLE_MAX + 1}, -EMSGSIZE,
		 "CA bundle larger than 1048576 bytes"},
		{{.ca_bundle = nul_ca, .ca_len = sizeof(nul_ca) - 1}, -EINVAL, "CA bundle contains NUL"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sbx_err_clear(&why);
		CHECK_EQ(sbx_encode_net_config(&b, &bad[i].r, &why), bad[i].err);
		CHECK_STR(why.msg, bad[i].msg);
		CHECK_EQ(why.syscall, 0);
		CHECK_EQ(b.len, before);
	}
	sbx_buf_free(&b);
}

/* Decode an EXEC frame back (what the guest will do) and compare. */
static void test_exec_roundtrip(void)
{
	struct sbx_env_var env[2] = {
		{(const uint8_t *)"A", 1, (const uint8_t *)"1", 1},
		{(const uint8_t *)"EMPTY", 5, NULL, 0},
	};
	struct sbx_exec_req r = {
		.id = 7, .language = SBX_LANG_PYTHON, .timeout_ms = 5000, .stdout_limit = 100,
		.stderr_limit = 200, .env = env, .env_count = 2,
		.code = (const uint8_t *)"print(1)", .code_len = 8,
	};
	struct sbx_buf b = {0};
	CHECK_EQ(sbx_encode_exec(&b, &r, &E), 0);
	struct sbx_reader rd;
	struct sbx_frame f;
	sbx_reader_init(&rd, SBX_HOST_FRAME_MAX);
	CHECK_EQ(sbx_reader_feed(&rd, b.data, b.len), 0);
	CHECK_EQ(sbx_reader_next(&rd, &f), 1);
	CHECK_EQ(f.type, SBX_MSG_EXEC);
	CHECK_EQ(f.id, 7);
	struct sbx_cursor c = {f.payload, f.payload_len};
	uint8_t lang;
	uint32_t v, n;
	const uint8_t *s;
	CHECK_EQ(sbx_get_u8(&c, &lang), 0);
	CHECK_EQ(lang, SBX_LANG_PYTHON);
	CHECK_EQ(sbx_get_u32(&c, &v), 0);
	CHECK_EQ(v, 5000);
	CHECK_EQ(sbx_get_u32(&c, &v), 0);
	CHECK_EQ(v, 100);
	CHECK_EQ(sbx_get_u32(&c, &v), 0);
	CHECK_EQ(v, 200);
	CHECK_EQ(sbx_get_u32(&c, &v), 0);
	CHECK_EQ(v, 2);
	CHECK_EQ(sbx_get_str(&c, SBX_ENV_NAME_MAX, &s, &n), 0);
	CHECK(n == 1 && s[0] == 'A');
	CHECK_EQ(sbx_get_str(&c, SBX_ENV_VALUE_MAX, &s, &n), 0);
	CHECK(n == 1 && s[0] == '1');
	CHECK_EQ(sbx_get_str(&c, SBX_ENV_NAME_MAX, &s, &n), 0);
	CHECK(n == 5 && memcmp(s, "EMPTY", 5) == 0);
	CHECK_EQ(sbx_get_str(&c, SBX_ENV_VALUE_MAX, &s, &n), 0);
	CHECK_EQ(n, 0);
	CHECK_EQ(sbx_get_str(&c, SBX_CODE_MAX, &s, &n), 0);
	CHECK(n == 8 && memcmp(s, "print(1)", 8) == 0);
	CHECK_EQ(c.left, 0);

	/* PING. */
	size_t before = b.len;
	CHECK_EQ(sbx_encode_ping(&b, 0xffffffffu, &E), 0);
	CHECK_EQ(b.len, before + 12);
	CHECK_EQ(b.data[before + 4], SBX_MSG_PING);
	sbx_reader_free(&rd);
	sbx_buf_free(&b);
}

static void test_exec_validation(void)
{
	struct sbx_env_var env = {(const uint8_t *)"A", 1, (const uint8_t *)"1", 1};
	const struct sbx_exec_req ok = {
		.id = 1, .language = SBX_LANG_RAW, .timeout_ms = 1, .env = &env, .env_count = 1,
		.code = (const uint8_t *)"true", .code_len = 4,
	};
	struct sbx_buf b = {0};
	struct sbx_err why = {0};
	CHECK_EQ(sbx_encode_exec(&b, &ok, &E), 0);
	size_t len = b.len;

	struct sbx_exec_req r = ok;
	r.language = 0;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);
	r.language = 4;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);
	r = ok;
	r.timeout_ms = SBX_TIMEOUT_MS_MAX + 1;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);
	r.timeout_ms = UINT32_MAX;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);
	r.timeout_ms = SBX_TIMEOUT_NONE; /* no limit: the code runs until it ends */
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), 0);
	r.timeout_ms = SBX_TIMEOUT_MS_MAX;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), 0);
	len = b.len;

	struct sbx_env_var bad = env;
	r = ok;
	r.env = &bad;
	bad.name = (const uint8_t *)"A=B";
	bad.name_len = 3;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);
	bad.name_len = 0;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);
	bad = env;
	bad.value = (const uint8_t *)"a\0b";
	bad.value_len = 3;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EINVAL);

	uint8_t *big = calloc(1, SBX_CODE_MAX + 1);
	memset(big, 'x', SBX_CODE_MAX + 1);
	bad = env;
	bad.name = big;
	bad.name_len = SBX_ENV_NAME_MAX + 1;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EMSGSIZE);
	bad = env;
	bad.value = big;
	bad.value_len = SBX_ENV_VALUE_MAX + 1;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EMSGSIZE);
	r = ok;
	r.code = big;
	r.code_len = SBX_CODE_MAX + 1;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EMSGSIZE);
	r.code_len = SBX_CODE_MAX;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), 0);
	b.len = len;

	/* 100 variables at 32 KiB each plus 1 MiB code: each within limits, the frame over. */
	struct sbx_env_var many[SBX_ENV_MAX_COUNT + 1];
	for (size_t i = 0; i < SBX_ENV_MAX_COUNT + 1; i++)
		many[i] = (struct sbx_env_var){(const uint8_t *)"V", 1, big, SBX_ENV_VALUE_MAX};
	r = ok;
	r.env = many;
	r.env_count = SBX_ENV_MAX_COUNT + 1;
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EMSGSIZE);
	r.env_count = SBX_ENV_MAX_COUNT;
	sbx_err_clear(&why);
	CHECK_EQ(sbx_encode_exec(&b, &r, &why), -EMSGSIZE);
	CHECK(strstr(why.msg, "HOST_FRAME_MAX"));
	CHECK_EQ(b.len, len); /* every failure left the buffer as it was */
	free(big);
	sbx_buf_free(&b);
}

/* One PROC_INFO entry in protocol.h's layout. */
static void p_proc(struct payload *p, uint32_t pid, uint8_t flags, int32_t code, uint64_t out,
		   uint64_t err, const char *command)
{
	p_u32(p, pid);
	p->b[p->n++] = flags;
	p_u32(p, (uint32_t)code);
	p_u32(p, (uint32_t)out);
	p_u32(p, (uint32_t)(out >> 32));
	p_u32(p, (uint32_t)err);
	p_u32(p, (uint32_t)(err >> 32));
	p_str(p, command);
}

static void test_proc_info(void)
{
	struct sbx_event ev;
	struct sbx_proc_entry e;
	P.n = 0;
	p_u32(&P, 2);
	p_proc(&P, 41, SBX_PROC_RUNNING | SBX_PROC_STDIN_OPEN, 0, 5, 1ull << 40, "sleep 9");
	p_proc(&P, 42, SBX_PROC_PTY, 130, 0, 0, "");
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_PROC_INFO);
	CHECK_STR(sbx_event_kind_name(ev.kind), "proc_info");
	CHECK_EQ(ev.count, 2);
	struct sbx_cursor c = {ev.data, ev.len};
	CHECK_EQ(sbx_proc_entry_next(&c, &e), 0);
	CHECK_EQ(e.pid, 41);
	CHECK_EQ(e.flags, SBX_PROC_RUNNING | SBX_PROC_STDIN_OPEN);
	CHECK(e.stderr_bytes == 1ull << 40);
	CHECK_EQ(e.command_len, 7);
	CHECK_EQ(sbx_proc_entry_next(&c, &e), 0);
	CHECK_EQ(e.exit_code, 130);
	CHECK_EQ(e.command_len, 0);
	CHECK_EQ(c.left, 0);
	/* An empty list is a list (LIST with nothing tracked). */
	P.n = 0;
	p_u32(&P, 0);
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), 0);
	CHECK_EQ(ev.count, 0);
	/* Each lie refused: pid 0, unknown flag, a status EXIT cannot carry, a status while
	 * running, a NUL in the command, an over-long command, a count past the tracked maximum,
	 * fewer entries than counted, a trailing byte. */
	struct {
		uint32_t pid;
		uint8_t flags;
		int32_t code;
		const char *command;
	} bad[] = {
		{0, 0, 0, "x"},
		{1, 1u << 3, 0, "x"},
		{1, 0, -1, "x"},
		{1, 0, 256, "x"},
		{1, SBX_PROC_RUNNING, 1, "x"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		P.n = 0;
		p_u32(&P, 1);
		p_proc(&P, bad[i].pid, bad[i].flags, bad[i].code, 0, 0, bad[i].command);
		CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), -EPROTO);
	}
	P.n = 0;
	p_u32(&P, 1);
	p_proc(&P, 1, 0, 0, 0, 0, "a");
	P.b[P.n - 1] = 0;
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), -EPROTO);
	char longer[SBX_PROC_COMMAND_MAX + 2];
	memset(longer, 'c', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = 0;
	P.n = 0;
	p_u32(&P, 1);
	p_proc(&P, 1, 0, 0, 0, 0, longer);
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), -EMSGSIZE);
	P.n = 0;
	p_u32(&P, SBX_PROC_TRACKED_MAX + 1);
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, 2);
	p_proc(&P, 1, 0, 0, 0, 0, "a");
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), -EPROTO);
	P.n = 0;
	p_u32(&P, 1);
	p_proc(&P, 1, 0, 0, 0, 0, "a");
	P.b[P.n++] = 0;
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), -EPROTO);
	/* The most a LIST can answer fits one guest frame. */
	memset(longer, 'c', SBX_PROC_COMMAND_MAX);
	longer[SBX_PROC_COMMAND_MAX] = 0;
	P.n = 0;
	p_u32(&P, SBX_PROC_TRACKED_MAX);
	for (uint32_t i = 0; i < SBX_PROC_TRACKED_MAX; i++)
		p_proc(&P, i + 1, 0, 0, 0, 0, longer);
	CHECK(P.n <= SBX_GUEST_FRAME_MAX);
	CHECK_EQ(decode(SBX_MSG_PROC_INFO, &P, &ev), 0);
	CHECK_EQ(ev.count, SBX_PROC_TRACKED_MAX);
}

static void p_u64(struct payload *p, uint64_t v)
{
	p_u32(p, (uint32_t)v);
	p_u32(p, (uint32_t)(v >> 32));
}

static void test_proc_data(void)
{
	struct sbx_event ev;
	P.n = 0;
	p_u64(&P, 1ull << 33);
	P.b[P.n++] = 0;
	p_bytes(&P, "out", 3);
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), 0);
	CHECK_EQ(ev.kind, SBX_EV_PROC_DATA);
	CHECK_STR(sbx_event_kind_name(ev.kind), "proc_data");
	CHECK(ev.value == 1ull << 33);
	CHECK_EQ(ev.flags, 0);
	CHECK_EQ(ev.len, 3);
	CHECK(memcmp(ev.data, "out", 3) == 0);
	/* Empty with EOF: the stream ended. */
	P.n = 0;
	p_u64(&P, 7);
	P.b[P.n++] = SBX_PROC_DATA_EOF;
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), 0);
	CHECK_EQ(ev.flags, SBX_PROC_DATA_EOF);
	CHECK_EQ(ev.len, 0);
	/* An unknown flag, a short header, more than one chunk, an offset that would wrap. */
	P.b[8] = 2;
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), -EPROTO);
	P.n = 8;
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), -EPROTO);
	P.n = 0;
	p_u64(&P, 0);
	P.b[P.n++] = 0;
	memset(P.b + P.n, 'f', SBX_OUTPUT_CHUNK_MAX + 1);
	P.n += SBX_OUTPUT_CHUNK_MAX;
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), 0);
	P.n++;
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), -EPROTO);
	P.n = 0;
	p_u64(&P, UINT64_MAX - 1);
	P.b[P.n++] = 0;
	p_bytes(&P, "ab", 2);
	CHECK_EQ(decode(SBX_MSG_PROC_DATA, &P, &ev), -EPROTO);
	/* Host -> guest process requests are never accepted from the guest. */
	P.n = 0;
	p_u32(&P, 0);
	for (uint8_t t = SBX_MSG_PROC_SPAWN; t <= SBX_MSG_PROC_RESIZE; t++)
		CHECK_EQ(decode(t, &P, &ev), -EPROTO);
}

/* Each PROC_* request in the layout of protocol.h, byte for byte (what the guest parses). */
static void test_proc_request_encoding(void)
{
	struct sbx_buf b = {0};
	struct sbx_bytes argv[] = {{(const uint8_t *)"sh", 2}, {(const uint8_t *)"-c", 2}};
	struct sbx_env_var env[] = {{(const uint8_t *)"A", 1, (const uint8_t *)"b", 1}};
	struct sbx_proc_req r = {.type = SBX_MSG_PROC_SPAWN, .id = 3, .flags = SBX_SPAWN_PTY,
				 .cols = 80, .rows = 0x102, .argv = argv, .argc = 2,
				 .cwd = (const uint8_t *)"/tmp", .cwd_len = 4, .env = env,
				 .env_count = 1};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_SPAWN, 3,
		      "\1\x50\0\2\1\2\0\0\0\2\0\0\0sh\2\0\0\0-c\4\0\0\0/tmp\1\0\0\0\1\0\0\0A\1\0\0\0b",
		      43);
	b.len = 0;
	r = (struct sbx_proc_req){.type = SBX_MSG_PROC_READ, .id = 4, .pid = 0x01020304,
				  .stream = SBX_PROC_STDERR, .offset = 0x1122334455667788ull,
				  .max = 9, .wait_ms = 0x100};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_READ, 4,
		      "\4\3\2\1\2\x88\x77\x66\x55\x44\x33\x22\x11\x09\0\0\0\0\1\0\0", 21);
	b.len = 0;
	r = (struct sbx_proc_req){.type = SBX_MSG_PROC_WRITE, .id = 5, .pid = 7,
				  .flags = SBX_PROC_CLOSE_STDIN, .data = (const uint8_t *)"hi",
				  .data_len = 2};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_WRITE, 5, "\7\0\0\0\1hi", 7);
	b.len = 0;
	r = (struct sbx_proc_req){.type = SBX_MSG_PROC_SIGNAL, .id = 6, .pid = 7, .signal = 15};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_SIGNAL, 6, "\7\0\0\0\x0f\0\0\0", 8);
	b.len = 0;
	r = (struct sbx_proc_req){.type = SBX_MSG_PROC_WAIT, .id = 7, .pid = 7, .wait_ms = 1};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_WAIT, 7, "\7\0\0\0\1\0\0\0", 8);
	b.len = 0;
	r = (struct sbx_proc_req){.type = SBX_MSG_PROC_LIST, .id = 8};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_LIST, 8, "", 0);
	b.len = 0;
	r = (struct sbx_proc_req){.type = SBX_MSG_PROC_RESIZE, .id = 9, .pid = 7, .cols = 1000,
				  .rows = 1};
	CHECK_EQ(sbx_encode_proc_request(&b, &r, &E), 0);
	check_payload(&b, SBX_MSG_PROC_RESIZE, 9, "\7\0\0\0\xe8\3\1\0", 8);
	sbx_buf_free(&b);
}

static void test_proc_request_limits(void)
{
	struct sbx_buf b = {0};
	struct sbx_bytes one[] = {{(const uint8_t *)"true", 4}};
	struct sbx_bytes empty[] = {{(const uint8_t *)"", 0}};
	struct sbx_bytes nul[] = {{(const uint8_t *)"a\0b", 3}};
	struct sbx_env_var badenv[] = {{(const uint8_t *)"A=B", 3, (const uint8_t *)"", 0}};
	static struct sbx_bytes many[SBX_PROC_ARGV_MAX + 1];
	for (size_t i = 0; i < SBX_PROC_ARGV_MAX + 1; i++)
		many[i] = one[0];
	uint8_t *big = malloc(SBX_PROC_ARG_MAX + 1);
	memset(big, 'a', SBX_PROC_ARG_MAX + 1);
	struct sbx_bytes huge[] = {{big, SBX_PROC_ARG_MAX + 1}};
	struct sbx_bytes largest[16];
	for (size_t i = 0; i < 16; i++)
		largest[i] = (struct sbx_bytes){big, SBX_PROC_ARG_MAX};
	const struct sbx_proc_req spawn = {.type = SBX_MSG_PROC_SPAWN, .id = 1, .argv = one,
					   .argc = 1};
	struct sbx_proc_req bad[] = {
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 0},
		{.type = SBX_MSG_PROC_SPAWN, .argv = many, .argc = SBX_PROC_ARGV_MAX + 1},
		{.type = SBX_MSG_PROC_SPAWN, .argv = empty, .argc = 1},
		{.type = SBX_MSG_PROC_SPAWN, .argv = nul, .argc = 1},
		{.type = SBX_MSG_PROC_SPAWN, .argv = huge, .argc = 1},
		{.type = SBX_MSG_PROC_SPAWN, .argv = largest, .argc = 16}, /* > HOST_FRAME_MAX */
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 1, .flags = 2},
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 1, .flags = SBX_SPAWN_PTY},
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 1, .cols = 80, .rows = 24},
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 1, .flags = SBX_SPAWN_PTY,
		 .cols = 1001, .rows = 24},
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 1, .cwd = (const uint8_t *)"tmp",
		 .cwd_len = 3},
		{.type = SBX_MSG_PROC_SPAWN, .argv = one, .argc = 1, .env = badenv, .env_count = 1},
		{.type = SBX_MSG_PROC_READ, .stream = 3, .max = 1},
		{.type = SBX_MSG_PROC_READ, .stream = 1, .max = 0},
		{.type = SBX_MSG_PROC_READ, .stream = 1, .max = SBX_OUTPUT_CHUNK_MAX + 1},
		{.type = SBX_MSG_PROC_READ, .stream = 1, .max = 1, .wait_ms = SBX_PROC_WAIT_MS_MAX + 1},
		{.type = SBX_MSG_PROC_WAIT, .wait_ms = SBX_PROC_WAIT_MS_MAX + 1},
		{.type = SBX_MSG_PROC_WRITE, .flags = 2},
		{.type = SBX_MSG_PROC_WRITE, .data = big, .data_len = SBX_PROC_WRITE_MAX + 1},
		{.type = SBX_MSG_PROC_SIGNAL, .signal = 0},
		{.type = SBX_MSG_PROC_SIGNAL, .signal = 65},
		{.type = SBX_MSG_PROC_RESIZE, .cols = 0, .rows = 1},
		{.type = SBX_MSG_PROC_RESIZE, .cols = 1, .rows = 1001},
		{.type = SBX_MSG_PING},
	};
	CHECK_EQ(sbx_encode_proc_request(&b, &spawn, &E), 0);
	size_t before = b.len;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = sbx_encode_proc_request(&b, &bad[i], &E);
		if (rc != -EINVAL && rc != -EMSGSIZE)
			fprintf(stderr, "bad[%zu] gave %d\n", i, rc);
		CHECK(rc == -EINVAL || rc == -EMSGSIZE);
		CHECK_EQ(b.len, before);
	}
	/* The largest write and the edges of the ranges are fine. */
	struct sbx_proc_req ok[] = {
		{.type = SBX_MSG_PROC_WRITE, .data = big, .data_len = SBX_PROC_WRITE_MAX},
		{.type = SBX_MSG_PROC_READ, .stream = 2, .max = SBX_OUTPUT_CHUNK_MAX,
		 .wait_ms = SBX_PROC_WAIT_MS_MAX},
		{.type = SBX_MSG_PROC_SIGNAL, .signal = 64},
		{.type = SBX_MSG_PROC_SPAWN, .argv = largest, .argc = 15},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		CHECK_EQ(sbx_encode_proc_request(&b, &ok[i], &E), 0);
	free(big);
	sbx_buf_free(&b);
}

int main(void)
{
	RUN(test_ready);
	RUN(test_output);
	RUN(test_exit);
	RUN(test_error);
	RUN(test_pong_and_bad_types);
	RUN(test_reseeded);
	RUN(test_reseed_encoding);
	RUN(test_prestart_encoding);
	RUN(test_file_data_and_done);
	RUN(test_file_entries);
	RUN(test_tool_call);
	RUN(test_rich_output);
	RUN(test_file_request_encoding);
	RUN(test_file_request_limits);
	RUN(test_tool_result_encoding);
	RUN(test_net_config_encoding);
	RUN(test_net_config_limits);
	RUN(test_exec_roundtrip);
	RUN(test_exec_validation);
	RUN(test_proc_info);
	RUN(test_proc_data);
	RUN(test_proc_request_encoding);
	RUN(test_proc_request_limits);
	TEST_MAIN_END("test_event");
}
