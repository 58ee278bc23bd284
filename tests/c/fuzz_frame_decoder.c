/* libFuzzer target: arbitrary guest bytes through exactly the path Vm.read_events() uses
 * (sbx_channel_ingest = what sbx_channel_read feeds after recv, then sbx_channel_next_event =
 * sbx_reader_next + sbx_event_decode), split at pseudo-random points.
 *
 * Input layout: 2 bytes seed for the split points, then the byte stream. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent_channel.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct sbx_channel CH;

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

static volatile uint32_t sink;

static int ident_char(uint8_t c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

static int mime_char(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '+' || c == '_' ||
	       c == '-';
}

static void check_event(const struct sbx_event *ev)
{
	uint32_t sum = 0;
	/* Touch every byte the event points at: ASan checks it lies in the decoder's buffer. */
	for (uint32_t i = 0; i < ev->len; i++)
		sum += ev->data[i];
	for (uint32_t i = 0; i < ev->name_len; i++)
		sum += ev->name[i];
	sink = sum;
	switch (ev->kind) {
	case SBX_EV_READY:
		REQUIRE(ev->len <= SBX_AGENT_VERSION_MAX);
		break;
	case SBX_EV_STDOUT:
	case SBX_EV_STDERR:
		REQUIRE(ev->len >= 1 && ev->len <= SBX_OUTPUT_CHUNK_MAX);
		break;
	case SBX_EV_EXIT:
		REQUIRE(ev->len == 0);
		REQUIRE((ev->exit.flags & ~(uint32_t)SBX_EXIT_FLAGS_ALL) == 0);
		REQUIRE(ev->exit.exit_code >= -1 && ev->exit.exit_code <= 255);
		break;
	case SBX_EV_ERROR:
		REQUIRE(ev->error_code >= SBX_ERR_BAD_REQUEST && ev->error_code <= SBX_ERR_MAX);
		REQUIRE(ev->len <= SBX_ERROR_MESSAGE_MAX);
		break;
	case SBX_EV_PONG:
	case SBX_EV_RESEEDED:
		REQUIRE(ev->len == 0);
		break;
	case SBX_EV_FILE_DATA:
		REQUIRE(ev->len >= 1 && ev->len <= SBX_FILE_CHUNK_MAX);
		break;
	case SBX_EV_FILE_DONE:
		REQUIRE(ev->len == 0);
		break;
	case SBX_EV_FILE_ERROR:
		REQUIRE(ev->error_code >= SBX_FILE_ERR_PATH && ev->error_code <= SBX_FILE_ERR_MAX);
		REQUIRE(ev->len <= SBX_ERROR_MESSAGE_MAX);
		break;
	case SBX_EV_FILE_ENTRIES: {
		/* What the binding does: walk every entry; each must decode and be a safe name. */
		REQUIRE(ev->count >= 1 && ev->count <= SBX_LIST_BATCH_MAX);
		struct sbx_cursor c = {ev->data, ev->len};
		for (uint32_t i = 0; i < ev->count; i++) {
			struct sbx_dir_entry e;
			REQUIRE(sbx_dir_entry_next(&c, &e) == 0);
			REQUIRE(e.name_len >= 1 && e.name_len <= SBX_PATH_COMPONENT_MAX);
			REQUIRE(!memchr(e.name, '/', e.name_len) && e.is_dir <= 1);
		}
		REQUIRE(c.left == 0);
		break;
	}
	case SBX_EV_TOOL_CALL:
		/* What the binding assumes: a number, an ASCII identifier, non-empty arguments. */
		REQUIRE(ev->call != 0);
		REQUIRE(ev->name_len >= 1 && ev->name_len <= SBX_TOOL_NAME_MAX);
		REQUIRE(!(ev->name[0] >= '0' && ev->name[0] <= '9'));
		for (uint32_t i = 0; i < ev->name_len; i++)
			REQUIRE(ident_char(ev->name[i]));
		REQUIRE(ev->len >= 1 && ev->len <= SBX_TOOL_ARGS_MAX);
		break;
	case SBX_EV_OUTPUT: {
		REQUIRE((ev->flags & ~(uint32_t)(SBX_OUTPUT_BEGIN | SBX_OUTPUT_END)) == 0);
		REQUIRE(ev->len <= SBX_OUTPUT_DATA_MAX);
		if (!(ev->flags & SBX_OUTPUT_BEGIN)) {
			REQUIRE(ev->name_len == 0);
			break;
		}
		/* type/subtype, lowercase, one slash with something on either side. */
		REQUIRE(ev->name_len >= 3 && ev->name_len <= SBX_MIME_TYPE_MAX);
		const uint8_t *slash = memchr(ev->name, '/', ev->name_len);
		REQUIRE(slash && slash != ev->name && slash != ev->name + ev->name_len - 1);
		REQUIRE(!memchr(slash + 1, '/', (size_t)(ev->name + ev->name_len - slash - 1)));
		for (uint32_t i = 0; i < ev->name_len; i++)
			REQUIRE(ev->name[i] == '/' || mime_char(ev->name[i]));
		break;
	}
	case SBX_EV_PROC_INFO: {
		/* What the binding does: walk every entry; each must decode within its limits. */
		REQUIRE(ev->count <= SBX_PROC_TRACKED_MAX);
		struct sbx_cursor c = {ev->data, ev->len};
		for (uint32_t i = 0; i < ev->count; i++) {
			struct sbx_proc_entry e;
			REQUIRE(sbx_proc_entry_next(&c, &e) == 0);
			REQUIRE(e.pid != 0 && (e.flags & ~(unsigned)SBX_PROC_FLAGS_ALL) == 0);
			REQUIRE(e.exit_code >= 0 && e.exit_code <= 255);
			REQUIRE(!(e.flags & SBX_PROC_RUNNING) || e.exit_code == 0);
			REQUIRE(e.command_len <= SBX_PROC_COMMAND_MAX);
			REQUIRE(!e.command_len || !memchr(e.command, 0, e.command_len));
		}
		REQUIRE(c.left == 0);
		break;
	}
	case SBX_EV_PROC_DATA:
		REQUIRE((ev->flags & ~(uint32_t)SBX_PROC_DATA_EOF) == 0);
		REQUIRE(ev->len <= SBX_OUTPUT_CHUNK_MAX);
		REQUIRE(ev->value <= UINT64_MAX - ev->len);
		break;
	default:
		__builtin_trap();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	uint32_t seed = (uint32_t)data[0] | (uint32_t)data[1] << 8;
	data += 2;
	size -= 2;

	sbx_channel_init(&CH, -1);
	size_t off = 0;
	int rc = 0;
	while (off < size) {
		seed = seed * 1103515245u + 12345u;
		/* Mostly short reads (1..16 bytes), sometimes up to one full read chunk. */
		size_t chunk = (seed >> 16) & 1 ? 1 + ((seed >> 8) & 15)
						: 1 + (seed >> 4) % SBX_CHANNEL_READ_CHUNK;
		if (chunk > size - off)
			chunk = size - off;
		rc = sbx_channel_ingest(&CH, data + off, chunk);
		off += chunk;
		if (rc < 0)
			break;
		struct sbx_event ev;
		while ((rc = sbx_channel_next_event(&CH, &ev)) == 1)
			check_event(&ev);
		if (rc < 0)
			break;
	}
	if (rc < 0 && rc != -ENOMEM) {
		/* Sticky: every later call reports the same error. */
		struct sbx_event ev;
		REQUIRE(CH.error == rc);
		REQUIRE(sbx_channel_next_event(&CH, &ev) == rc);
		REQUIRE(sbx_channel_ingest(&CH, "x", 1) == rc);
	}
	sbx_channel_destroy(&CH);
	return 0;
}
