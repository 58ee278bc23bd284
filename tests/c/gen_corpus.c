/* Writes the seed corpus for fuzz_frame_decoder into the directory given as argv[1]:
 * valid frames of every guest type, a few streams, and typical violations. Each file starts
 * with the fuzzer's 2-byte split seed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

static const char *dir;

static void emit(const char *name, const struct sbx_buf *b, uint16_t seed)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/seed_%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		exit(1);
	}
	uint8_t s[2] = {(uint8_t)seed, (uint8_t)(seed >> 8)};
	fwrite(s, 1, 2, f);
	fwrite(b->data, 1, b->len, f);
	fclose(f);
}

static void frame(struct sbx_buf *b, uint8_t type, uint32_t id, const void *p, size_t n)
{
	size_t start;
	sbx_frame_begin(b, type, id, &start);
	sbx_buf_append(b, p, n);
	sbx_frame_end(b, start, UINT32_MAX);
}

static void ready(struct sbx_buf *b, uint32_t version, const char *agent)
{
	size_t start;
	sbx_frame_begin(b, SBX_MSG_READY, 0, &start);
	sbx_put_u32(b, version);
	sbx_put_str(b, agent, strlen(agent));
	sbx_frame_end(b, start, UINT32_MAX);
}

static void error(struct sbx_buf *b, uint32_t id, uint32_t code, const char *msg)
{
	size_t start;
	sbx_frame_begin(b, SBX_MSG_ERROR, id, &start);
	sbx_put_u32(b, code);
	sbx_put_str(b, msg, strlen(msg));
	sbx_frame_end(b, start, UINT32_MAX);
}

static void tool_call(struct sbx_buf *b, uint32_t id, uint32_t call, const char *name,
		      const char *args)
{
	size_t start;
	sbx_frame_begin(b, SBX_MSG_TOOL_CALL, id, &start);
	sbx_put_u32(b, call);
	sbx_put_str(b, name, strlen(name));
	sbx_put_str(b, args, strlen(args));
	sbx_frame_end(b, start, UINT32_MAX);
}

/* mime: with SBX_OUTPUT_BEGIN in flags, else NULL. */
static void output(struct sbx_buf *b, uint32_t id, uint8_t flags, const char *mime,
		   const void *data, size_t n)
{
	size_t start;
	sbx_frame_begin(b, SBX_MSG_OUTPUT, id, &start);
	sbx_put_u8(b, flags);
	if (mime)
		sbx_put_str(b, mime, strlen(mime));
	if (n)
		sbx_buf_append(b, data, n);
	sbx_frame_end(b, start, UINT32_MAX);
}

int main(int argc, char **argv)
{
	struct sbx_buf b = {0};
	struct sbx_exit ex = {.exit_code = 0, .flags = 0, .duration_us = 1500};
	if (argc != 2)
		return 2;
	dir = argv[1];

	ready(&b, SBX_PROTOCOL_VERSION, "sbx-agent 0.1.0");
	emit("ready", &b, 1);
	b.len = 0;
	frame(&b, SBX_MSG_STDOUT, 1, "hello\n", 6);
	emit("stdout", &b, 2);
	b.len = 0;
	frame(&b, SBX_MSG_STDERR, 1, "Traceback\n", 10);
	emit("stderr", &b, 3);
	b.len = 0;
	sbx_encode_exit(&b, 1, &ex);
	emit("exit", &b, 4);
	b.len = 0;
	error(&b, 1, SBX_ERR_SPAWN, "python3: not found");
	emit("error", &b, 5);
	b.len = 0;
	frame(&b, SBX_MSG_PONG, 42, NULL, 0);
	emit("pong", &b, 6);

	b.len = 0;
	frame(&b, SBX_MSG_RESEEDED, 43, NULL, 0);
	emit("reseeded", &b, 6);

	/* A whole session. */
	b.len = 0;
	ready(&b, SBX_PROTOCOL_VERSION, "sbx-agent 0.1.0");
	frame(&b, SBX_MSG_PONG, 1, NULL, 0);
	for (int i = 0; i < 5; i++)
		frame(&b, i & 1 ? SBX_MSG_STDERR : SBX_MSG_STDOUT, 2, "line of output\n", 15);
	ex = (struct sbx_exit){.exit_code = -1, .flags = SBX_EXIT_TIMED_OUT, .duration_us = 30000000};
	sbx_encode_exit(&b, 2, &ex);
	error(&b, 3, SBX_ERR_BUSY, "busy");
	emit("session", &b, 7);

	/* A maximal output chunk. */
	b.len = 0;
	char *big = malloc(SBX_OUTPUT_CHUNK_MAX);
	memset(big, 'A', SBX_OUTPUT_CHUNK_MAX);
	frame(&b, SBX_MSG_STDOUT, 9, big, SBX_OUTPUT_CHUNK_MAX);
	frame(&b, SBX_MSG_STDOUT, 9, big, 100);
	emit("max_chunk", &b, 8);
	free(big);

	/* Violations. */
	b.len = 0;
	frame(&b, SBX_MSG_PONG, 1, NULL, 0);
	b.data[5] = 1;
	emit("bad_flags", &b, 9);
	b.len = 0;
	frame(&b, SBX_MSG_STDOUT, 1, "x", 1);
	b.data[0] = 0xff;
	b.data[1] = 0xff;
	b.data[2] = 0x01;
	emit("oversize", &b, 10);
	b.len = 0;
	frame(&b, SBX_MSG_EXEC, 1, NULL, 0);
	emit("host_type", &b, 11);
	b.len = 0;
	ex = (struct sbx_exit){.exit_code = 300, .flags = 8, .duration_us = 1};
	sbx_encode_exit(&b, 1, &ex);
	emit("bad_exit", &b, 12);
	b.len = 0;
	frame(&b, SBX_MSG_READY, 0, "\x01\x00\x00\x00\x10\x00\x00\x00short", 13);
	emit("bad_ready", &b, 13);

	/* File transfers: a read (data + done), a listing, an error; then violations. */
	b.len = 0;
	frame(&b, SBX_MSG_FILE_DATA, 20, "file bytes", 10);
	frame(&b, SBX_MSG_FILE_DONE, 20, "\x0a\0\0\0\0\0\0\0", 8);
	frame(&b, SBX_MSG_FILE_ENTRIES, 21,
	      "\x02\0\0\0"
	      "\x01\x00\x10\0\0\0\0\0\0\x03\0\0\0dir"
	      "\x00\x05\0\0\0\0\0\0\0\x05\0\0\0a.txt",
	      4 + 16 + 18);
	frame(&b, SBX_MSG_FILE_DONE, 21, "\x02\0\0\0\0\0\0\0", 8);
	frame(&b, SBX_MSG_FILE_ERROR, 22, "\x02\0\0\0\x04\0\0\0gone", 12);
	emit("files", &b, 14);
	b.len = 0;
	frame(&b, SBX_MSG_FILE_ENTRIES, 23, "\x01\0\0\0\x00\x01\0\0\0\0\0\0\0\x02\0\0\0..", 4 + 15);
	emit("bad_entry", &b, 15);
	b.len = 0;
	frame(&b, SBX_MSG_FILE_ERROR, 24, "\x09\0\0\0\0\0\0\0", 8);
	emit("bad_file_error", &b, 16);

	/* Host tools and rich outputs: calls and outputs within one execution, as the agent sends
	 * them; then violations of each field. */
	b.len = 0;
	tool_call(&b, 30, 1, "get_weather", "{\"args\": [\"Paris\"], \"kwargs\": {}}");
	output(&b, 30, SBX_OUTPUT_BEGIN | SBX_OUTPUT_END, "image/png", "\x89PNG\r\n\x1a\n", 8);
	output(&b, 30, SBX_OUTPUT_BEGIN, "text/html", "<b>", 3);
	output(&b, 30, 0, NULL, "bold", 4);
	output(&b, 30, SBX_OUTPUT_END, NULL, "</b>", 4);
	output(&b, 30, SBX_OUTPUT_BEGIN | SBX_OUTPUT_END, "application/json", NULL, 0);
	tool_call(&b, 30, 2, "_Lookup2", "{}");
	sbx_encode_exit(&b, 30, &ex);
	emit("tools_outputs", &b, 17);
	b.len = 0;
	char *chunk = malloc(SBX_OUTPUT_DATA_MAX);
	memset(chunk, 'P', SBX_OUTPUT_DATA_MAX);
	output(&b, 31, SBX_OUTPUT_BEGIN, "application/vnd.plotly.v1+json", chunk, SBX_OUTPUT_DATA_MAX);
	output(&b, 31, SBX_OUTPUT_END, NULL, chunk, SBX_OUTPUT_DATA_MAX);
	emit("max_output", &b, 18);
	free(chunk);
	b.len = 0;
	tool_call(&b, 32, 0, "f", "{}");
	emit("bad_call_zero", &b, 19);
	b.len = 0;
	tool_call(&b, 32, 1, "9f-x", "{}");
	emit("bad_tool_name", &b, 20);
	b.len = 0;
	tool_call(&b, 32, 1, "f", "");
	emit("bad_tool_args", &b, 21);
	b.len = 0;
	output(&b, 33, SBX_OUTPUT_BEGIN | 4, "text/plain", "x", 1);
	emit("bad_output_flags", &b, 22);
	b.len = 0;
	output(&b, 33, SBX_OUTPUT_BEGIN, "Text/html/x", "x", 1);
	emit("bad_mime_type", &b, 23);

	/* Processes: a spawn's PROC_INFO, output pulled with a drop (offset jump) and EOF, a wait,
	 * a list, the new error codes; then a lie in each field. */
	b.len = 0;
	static const char info1[] = "\x01\0\0\0" "\x2a\0\0\0" "\x05" "\0\0\0\0"
				    "\0\0\0\0\0\0\0\0" "\0\0\0\0\0\0\0\0"
				    "\x0e\0\0\0" "python3 -m http";
	frame(&b, SBX_MSG_PROC_INFO, 40, info1, sizeof(info1) - 1);
	frame(&b, SBX_MSG_PROC_DATA, 41, "\0\0\0\0\0\0\0\0\0" "hello", 14);
	frame(&b, SBX_MSG_PROC_DATA, 42, "\x00\x10\0\0\0\0\0\0\0" "late", 13);
	frame(&b, SBX_MSG_PROC_DATA, 43, "\x04\x10\0\0\0\0\0\0\x01", 9);
	frame(&b, SBX_MSG_PONG, 44, NULL, 0);
	static const char info2[] = "\x02\0\0\0"
				    "\x2a\0\0\0" "\x00" "\x8f\0\0\0"
				    "\x05\0\0\0\0\0\0\0" "\0\0\0\0\0\0\0\0" "\x01\0\0\0" "x"
				    "\x2b\0\0\0" "\x03" "\0\0\0\0"
				    "\0\0\0\0\0\0\0\0" "\0\0\0\0\0\0\0\0" "\0\0\0\0";
	frame(&b, SBX_MSG_PROC_INFO, 45, info2, sizeof(info2) - 1);
	error(&b, 46, SBX_ERR_NO_PROCESS, "no such process");
	error(&b, 47, SBX_ERR_LIMIT, "too many processes");
	emit("processes", &b, 24);
	b.len = 0;
	static const char bad_info[] = "\x01\0\0\0" "\x2a\0\0\0" "\x01" "\x01\0\0\0"
				       "\0\0\0\0\0\0\0\0" "\0\0\0\0\0\0\0\0" "\0\0\0\0";
	frame(&b, SBX_MSG_PROC_INFO, 48, bad_info, sizeof(bad_info) - 1);
	emit("bad_proc_info", &b, 25);
	b.len = 0;
	frame(&b, SBX_MSG_PROC_DATA, 49, "\xff\xff\xff\xff\xff\xff\xff\xff\x00" "ab", 11);
	emit("bad_proc_data", &b, 26);
	sbx_buf_free(&b);
	return 0;
}
