/* Host -> guest frames (EXEC, PING), validated against protocol.h's limits before encoding. */
#ifndef SBX_REQUEST_H
#define SBX_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"

struct sbx_env_var {
	const uint8_t *name;
	size_t name_len;
	const uint8_t *value;
	size_t value_len;
};

struct sbx_exec_req {
	uint32_t id;
	uint32_t language; /* enum sbx_language */
	uint32_t timeout_ms;
	uint32_t stdout_limit;
	uint32_t stderr_limit;
	const struct sbx_env_var *env;
	size_t env_count;
	const uint8_t *code;
	size_t code_len;
	int session; /* nonzero: SESSION_EXEC (run in the session's REPL) instead of EXEC */
};

/* Append one EXEC frame to b. Returns 0, or -EINVAL (bad language/timeout/env name: *why says
 * which), -EMSGSIZE (a field or the whole frame over its limit: *why says which) or -ENOMEM.
 * On failure b is left as it was. */
int sbx_encode_exec(struct sbx_buf *b, const struct sbx_exec_req *r, const char **why);
/* Append one file-transfer frame (FILE_WRITE_BEGIN .. FILE_LIST) whose payload the caller built.
 * -EINVAL for any other type, -EMSGSIZE over SBX_HOST_FRAME_MAX. */
int sbx_encode_file_frame(struct sbx_buf *b, uint8_t type, uint32_t id, const void *payload,
			  size_t len);
/* Append one PING frame. */
int sbx_encode_ping(struct sbx_buf *b, uint32_t id);
/* Append one RESEED frame; n must be SBX_RESEED_BYTES (-EINVAL otherwise). */
int sbx_encode_reseed(struct sbx_buf *b, uint32_t id, const uint8_t *seed, size_t n,
		      uint64_t realtime_ns);
/* PRESTART: one byte, the language whose interpreter the guest pre-starts. */
int sbx_encode_prestart(struct sbx_buf *b, uint32_t id, uint8_t language);

#endif /* SBX_REQUEST_H */
