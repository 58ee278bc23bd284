/* libFuzzer target for the guest side: arbitrary host bytes through the agent's decoding path
 * (sbx_reader with the host frame limit, as guest/src/agent_channel_guest.c feeds it, then
 * sbx_parse_exec for every EXEC frame, sbx_parse_prestart for every PRESTART and
 * sbx_parse_file_path for the FILE_* requests that carry a path, as guest/src/dispatch.c and
 * files.c do, and the PROC_* parsers as guest/src/procs.c does), split at pseudo-random points.
 *
 * The host is trusted, but the agent is PID 1: a crash there is a dead VM, and the parser is the
 * place where a length field could walk out of the payload. Every accepted request is checked
 * against the limits of protocol.h and every pointer it holds is read (ASan: inside the frame).
 *
 * Input layout: 2 bytes seed for the split points, then the byte stream. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
/* The guest's decoder; the host's encoder is agent_request.h. */
#include "../../guest/src/agent_request_guest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

static volatile uint32_t sink;

static int in_frame(const uint8_t *p, uint32_t n, const struct sbx_frame *f)
{
	return p >= f->payload && p + n <= f->payload + f->payload_len;
}

static void check_request(const struct sbx_exec_request *r, const struct sbx_frame *f)
{
	uint32_t sum = 0;
	REQUIRE(r->language == SBX_LANG_PYTHON || r->language == SBX_LANG_JAVASCRIPT ||
		r->language == SBX_LANG_RAW);
	REQUIRE(r->timeout_ms <= SBX_TIMEOUT_MS_MAX);
	REQUIRE(r->env_count <= SBX_ENV_MAX_COUNT);
	REQUIRE(r->code_len <= SBX_CODE_MAX);
	REQUIRE(r->code_len == 0 || in_frame(r->code, r->code_len, f));
	for (uint32_t i = 0; i < r->code_len; i++)
		sum += r->code[i];
	for (uint32_t i = 0; i < r->env_count; i++) {
		const struct sbx_env_var *v = &r->env[i];
		REQUIRE(v->name_len >= 1 && v->name_len <= SBX_ENV_NAME_MAX);
		REQUIRE(v->value_len <= SBX_ENV_VALUE_MAX);
		REQUIRE(in_frame(v->name, v->name_len, f));
		REQUIRE(v->value_len == 0 || in_frame(v->value, v->value_len, f));
		/* what the runner relies on when it builds envp: a name of [A-Za-z_][A-Za-z0-9_]*
		 * and a value without NUL */
		REQUIRE(v->name[0] == '_' || (v->name[0] | 0x20) >= 'a');
		for (uint32_t k = 0; k < v->name_len; k++) {
			uint8_t ch = v->name[k];
			REQUIRE(ch == '_' || (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
				(ch >= 'A' && ch <= 'Z'));
		}
		REQUIRE(memchr(v->value, 0, v->value_len) == NULL);
		for (uint32_t k = 0; k < v->value_len; k++)
			sum += v->value[k];
	}
	sink = sum;
}

/* What files.c relies on when it walks a path from the home directory: components that are
 * non-empty, short, never "." or "..", free of '/' and NUL, and that rebuild the path. */
static void check_file_path(const struct sbx_frame *f)
{
	static struct sbx_path_parts p;
	bool with_u8 = f->type == SBX_MSG_FILE_WRITE_BEGIN || f->type == SBX_MSG_FILE_READ;
	bool allow_empty = f->type == SBX_MSG_FILE_LIST;
	uint8_t allowed = f->type == SBX_MSG_FILE_WRITE_BEGIN
				  ? SBX_FILE_EXECUTABLE | SBX_FILE_NODE_SNAPSHOT
				  : SBX_FILE_NODE_SNAPSHOT;
	uint8_t extra = 0;
	int rc = with_u8 ? sbx_parse_file_target(f->payload, f->payload_len, allowed, &p, &extra)
			 : sbx_parse_file_path(f->payload, f->payload_len, false, true, &p, NULL);
	if (rc < 0) {
		REQUIRE(rc == -EPROTO || rc == -EINVAL);
		return;
	}
	/* A flag outside the request's own never passes; node's startup snapshot is named by its
	 * flag alone, every other target by a non-empty path. */
	REQUIRE((extra & ~allowed) == 0);
	if (extra & SBX_FILE_NODE_SNAPSHOT)
		REQUIRE(extra == SBX_FILE_NODE_SNAPSHOT && p.n == 0);
	else
		REQUIRE(p.n > 0 || allow_empty);
	REQUIRE(p.n <= SBX_PATH_COMPONENTS_MAX);
	size_t total = 0;
	for (size_t i = 0; i < p.n; i++) {
		size_t n = strlen(p.comp[i]);
		REQUIRE(p.comp[i] >= p.buf && p.comp[i] + n <= p.buf + sizeof(p.buf) - 1);
		REQUIRE(n >= 1 && n <= SBX_PATH_COMPONENT_MAX && !memchr(p.comp[i], '/', n));
		REQUIRE(strcmp(p.comp[i], ".") != 0 && strcmp(p.comp[i], "..") != 0);
		total += n + (i > 0);
	}
	/* str path = u32 length + bytes, then the u8 when there is one: nothing else. */
	REQUIRE(total + 4 + with_u8 == f->payload_len);
}

/* What procs.c relies on: every limit of protocol.h's "Processes", pointers inside the frame. */
static void check_proc(const struct sbx_frame *f)
{
	if (f->type == SBX_MSG_PROC_SPAWN) {
		struct sbx_proc_spawn_request *req = malloc(sizeof(*req));
		REQUIRE(req);
		const char *why = NULL;
		int rc = sbx_parse_proc_spawn(f->payload, f->payload_len, req, &why);
		if (rc < 0) {
			REQUIRE((rc == -EPROTO || rc == -EMSGSIZE) && why && why[0]);
			free(req);
			return;
		}
		REQUIRE((req->flags & ~(unsigned)SBX_SPAWN_PTY) == 0);
		if (req->flags & SBX_SPAWN_PTY)
			REQUIRE(req->cols >= 1 && req->cols <= SBX_PROC_TTY_MAX && req->rows >= 1 &&
				req->rows <= SBX_PROC_TTY_MAX);
		else
			REQUIRE(req->cols == 0 && req->rows == 0);
		REQUIRE(req->argc >= 1 && req->argc <= SBX_PROC_ARGV_MAX);
		uint32_t sum = 0;
		for (uint32_t i = 0; i < req->argc; i++) {
			const struct sbx_bytes *a = &req->argv[i];
			REQUIRE(a->n >= 1 && a->n <= SBX_PROC_ARG_MAX && in_frame(a->p, a->n, f));
			REQUIRE(memchr(a->p, 0, a->n) == NULL);
			sum += a->p[a->n - 1];
		}
		REQUIRE(req->cwd.n <= SBX_PATH_MAX);
		if (req->cwd.n)
			REQUIRE(in_frame(req->cwd.p, req->cwd.n, f) && req->cwd.p[0] == '/' &&
				memchr(req->cwd.p, 0, req->cwd.n) == NULL);
		REQUIRE(req->env_count <= SBX_ENV_MAX_COUNT);
		for (uint32_t i = 0; i < req->env_count; i++) {
			const struct sbx_env_var *v = &req->env[i];
			REQUIRE(v->name_len >= 1 && v->name_len <= SBX_ENV_NAME_MAX);
			REQUIRE(in_frame(v->name, v->name_len, f));
			REQUIRE(v->value_len <= SBX_ENV_VALUE_MAX);
			REQUIRE(v->value_len == 0 || (in_frame(v->value, v->value_len, f) &&
						      memchr(v->value, 0, v->value_len) == NULL));
		}
		sink = sum;
		free(req);
		return;
	}
	struct sbx_proc_request r;
	const char *why = NULL;
	int rc = sbx_parse_proc_request(f->type, f->payload, f->payload_len, &r, &why);
	if (rc < 0) {
		REQUIRE((rc == -EPROTO || rc == -EMSGSIZE) && why && why[0]);
		return;
	}
	REQUIRE(r.type == f->type);
	REQUIRE(f->type == SBX_MSG_PROC_LIST ? f->payload_len == 0 : r.pid != 0);
	REQUIRE(r.wait_ms <= SBX_PROC_WAIT_MS_MAX);
	switch (f->type) {
	case SBX_MSG_PROC_READ:
		REQUIRE(r.stream == SBX_PROC_STDOUT || r.stream == SBX_PROC_STDERR);
		REQUIRE(r.max >= 1 && r.max <= SBX_OUTPUT_CHUNK_MAX);
		REQUIRE(f->payload_len == 21);
		break;
	case SBX_MSG_PROC_WRITE:
		REQUIRE((r.flags & ~(unsigned)SBX_PROC_CLOSE_STDIN) == 0);
		REQUIRE(r.data.n <= SBX_PROC_WRITE_MAX && r.data.n + 5 == f->payload_len);
		REQUIRE(r.data.n == 0 || in_frame(r.data.p, r.data.n, f));
		break;
	case SBX_MSG_PROC_SIGNAL:
		REQUIRE(r.signal >= 1 && r.signal <= 64);
		break;
	case SBX_MSG_PROC_RESIZE:
		REQUIRE(r.cols >= 1 && r.cols <= SBX_PROC_TTY_MAX && r.rows >= 1 &&
			r.rows <= SBX_PROC_TTY_MAX);
		break;
	default:
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	uint32_t seed = (uint32_t)data[0] << 8 | data[1];
	data += 2;
	size -= 2;

	struct sbx_reader rd;
	sbx_reader_init(&rd, SBX_HOST_FRAME_MAX);
	size_t off = 0;
	int broken = 0;
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
			REQUIRE(f.payload_len <= SBX_HOST_FRAME_MAX);
			if (f.type == SBX_MSG_PRESTART) {
				uint8_t language = 0;
				const char *pwhy = NULL;
				int prc = sbx_parse_prestart(f.payload, f.payload_len, &language, &pwhy);
				if (prc == 0)
					REQUIRE(f.payload_len == 1 && sbx_language_valid(language));
				else
					REQUIRE(prc == -EPROTO && pwhy && pwhy[0]);
				continue;
			}
			if (f.type == SBX_MSG_FILE_WRITE_BEGIN || f.type == SBX_MSG_FILE_READ ||
			    f.type == SBX_MSG_FILE_LIST) {
				check_file_path(&f);
				continue;
			}
			if (f.type >= SBX_MSG_PROC_SPAWN && f.type <= SBX_MSG_PROC_RESIZE) {
				check_proc(&f);
				continue;
			}
			if (f.type != SBX_MSG_EXEC && f.type != SBX_MSG_SESSION_EXEC)
				continue;
			/* What the agent's dispatcher does with an EXEC frame; the request struct is
			 * large (env array), so it lives on the heap like a real call frame would. */
			struct sbx_exec_request *req = malloc(sizeof(*req));
			REQUIRE(req);
			const char *why = NULL;
			int prc = sbx_parse_exec(f.payload, f.payload_len, req, &why);
			if (prc == 0)
				check_request(req, &f);
			else
				REQUIRE((prc == -EPROTO || prc == -EMSGSIZE) && why && why[0]);
			free(req);
		}
		if (rc < 0)
			broken = 1;
	}
	sbx_reader_free(&rd);
	return 0;
}
