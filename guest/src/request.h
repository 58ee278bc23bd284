/* Decoding and validation of an EXEC payload (layout in protocol.h). Pure: no I/O, so the host
 * tests can exercise it directly. */
#ifndef SBX_REQUEST_H
#define SBX_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

struct sbx_env_var {
	const uint8_t *name; /* points into the frame payload; [A-Za-z_][A-Za-z0-9_]* */
	uint32_t name_len;
	const uint8_t *value; /* no NUL bytes */
	uint32_t value_len;
};

/* Every pointer refers to the frame payload and lives as long as it does. */
struct sbx_exec_request {
	uint8_t language; /* enum sbx_language */
	uint32_t timeout_ms;
	uint32_t stdout_limit;
	uint32_t stderr_limit;
	uint32_t env_count;
	struct sbx_env_var env[SBX_ENV_MAX_COUNT];
	const uint8_t *code;
	uint32_t code_len;
};

#define SBX_TIMEOUT_MS_MAX 300000u

/* 0, or -EPROTO/-EMSGSIZE with *why set to a static explanation for the ERROR message. */
int sbx_parse_exec(const uint8_t *payload, size_t len, struct sbx_exec_request *req,
		   const char **why);

/* PRESTART payload: exactly one byte, a language with a pre-started interpreter (python,
 * javascript or raw: all three). 0, or -EPROTO with *why describing the problem. */
int sbx_parse_prestart(const uint8_t *payload, size_t len, uint8_t *language, const char **why);

#endif /* SBX_REQUEST_H */
