/* libFuzzer target for the host socket's decoding (guest/src/host_request_guest.c): arbitrary
 * client bytes through the path guest/src/host_socket.c takes (sbx_reader with the clients'
 * frame limit, then sbx_parse_local_request for every frame), split at pseudo-random points; and
 * sbx_parse_tool_result on the payload of every frame typed TOOL_RESULT.
 *
 * The clients are user code, the attacker, and the agent is PID 1: every accepted request is
 * checked against what the agent relies on when it forwards it (name and mime type characters,
 * UTF-8 arguments, sizes) and every pointer it holds is read (ASan: inside the frame).
 *
 * Input layout: 2 bytes seed for the split points, then the byte stream. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "frame.h"
#include "../../guest/src/host_request_guest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

static volatile uint32_t sink;

static bool inside(const uint8_t *p, uint32_t n, const struct sbx_frame *f)
{
	return n == 0 || (p >= f->payload && p + n <= f->payload + f->payload_len);
}

static uint32_t sum(const uint8_t *p, uint32_t n)
{
	uint32_t s = 0;
	for (uint32_t i = 0; i < n; i++)
		s += p[i];
	return s;
}

static void check_request(const struct sbx_frame *f)
{
	struct sbx_local_request r;
	const char *why = NULL;
	int rc = sbx_parse_local_request(f->type, f->payload, f->payload_len, &r, &why);
	if (rc < 0) {
		REQUIRE((rc == -EPROTO || rc == -EMSGSIZE) && why && why[0]);
		return;
	}
	REQUIRE(r.type == f->type);
	if (r.type == SBX_LOCAL_CALL) {
		REQUIRE(r.name_len >= 1 && r.name_len <= SBX_TOOL_NAME_MAX);
		/* What the host's decoder accepts (src/_execsbx/event.c): it ends the VM otherwise. */
		REQUIRE(r.args_len >= 1 && r.args_len <= SBX_TOOL_ARGS_MAX);
		REQUIRE(inside(r.name, r.name_len, f) && inside(r.args, r.args_len, f));
		REQUIRE(!(r.name[0] >= '0' && r.name[0] <= '9'));
		for (uint32_t i = 0; i < r.name_len; i++) {
			uint8_t c = r.name[i];
			REQUIRE(c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
				(c >= 'A' && c <= 'Z'));
		}
		REQUIRE(sbx_utf8_valid(r.args, r.args_len));
		/* str name + str args, nothing else: the TOOL_CALL built from it fits one frame */
		REQUIRE(8u + r.name_len + r.args_len == f->payload_len);
		REQUIRE(4u + 8u + r.name_len + r.args_len <= SBX_GUEST_FRAME_MAX);
		sink = sum(r.name, r.name_len) + sum(r.args, r.args_len);
		return;
	}
	REQUIRE(r.type == SBX_LOCAL_OUTPUT);
	REQUIRE(r.mime_len >= 1 && r.mime_len <= SBX_MIME_TYPE_MAX);
	REQUIRE(r.data_len <= SBX_OUTPUT_ITEM_MAX);
	REQUIRE(inside(r.mime, r.mime_len, f) && inside(r.data, r.data_len, f));
	REQUIRE(4u + r.mime_len + r.data_len == f->payload_len);
	uint32_t slashes = 0;
	for (uint32_t i = 0; i < r.mime_len; i++) {
		uint8_t c = r.mime[i];
		slashes += c == '/';
		REQUIRE(c == '/' || c == '.' || c == '+' || c == '_' || c == '-' ||
			(c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'));
	}
	REQUIRE(slashes == 1 && r.mime[0] != '/' && r.mime[r.mime_len - 1] != '/');
	sink = sum(r.mime, r.mime_len) + sum(r.data, r.data_len);
}

static void check_tool_result(const struct sbx_frame *f)
{
	struct sbx_tool_result r;
	const char *why = NULL;
	int rc = sbx_parse_tool_result(f->payload, f->payload_len, &r, &why);
	if (rc < 0) {
		REQUIRE((rc == -EPROTO || rc == -EMSGSIZE) && why && why[0]);
		return;
	}
	REQUIRE(r.call != 0 && (r.status == SBX_TOOL_OK || r.status == SBX_TOOL_ERROR));
	REQUIRE(r.body_len <= SBX_TOOL_RESULT_MAX && inside(r.body, r.body_len, f));
	REQUIRE(9u + r.body_len == f->payload_len);
	sink = sum(r.body, r.body_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	uint32_t seed = (uint32_t)data[0] << 8 | data[1];
	data += 2;
	size -= 2;

	struct sbx_reader rd;
	sbx_reader_init(&rd, SBX_LOCAL_FRAME_MAX);
	size_t off = 0;
	bool broken = false;
	while (off < size && !broken) {
		seed = seed * 1103515245u + 12345u;
		size_t chunk = 1 + (seed >> 8) % 4096;
		if (chunk > size - off)
			chunk = size - off;
		if (sbx_reader_feed(&rd, data + off, chunk) < 0)
			break;
		off += chunk;
		struct sbx_frame f;
		int rc;
		while ((rc = sbx_reader_next(&rd, &f)) == 1) {
			REQUIRE(f.payload_len <= SBX_LOCAL_FRAME_MAX);
			if (f.type == SBX_MSG_TOOL_RESULT)
				check_tool_result(&f);
			else
				check_request(&f);
		}
		if (rc < 0)
			broken = true;
	}
	sbx_reader_free(&rd);
	return 0;
}
