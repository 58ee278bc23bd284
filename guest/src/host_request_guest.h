/* Decoding and validation of what arrives for the host socket (docs/protocol.md, "Host tools and
 * rich outputs"): the requests of user code (LOCAL_CALL, LOCAL_OUTPUT), which is the attacker,
 * and the host's TOOL_RESULT. Pure: no I/O, so the fuzz target (tests/c/fuzz_host_request.c)
 * exercises it directly. */
#ifndef SBX_HOST_REQUEST_GUEST_H
#define SBX_HOST_REQUEST_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

/* The largest request frame a client may send: an output's data, its mime type and room. */
#define SBX_LOCAL_FRAME_MAX (SBX_OUTPUT_ITEM_MAX + 4096u)

/* A request of user code; every pointer refers to the frame payload and lives as long as it. */
struct sbx_local_request {
	uint8_t type; /* SBX_LOCAL_CALL or SBX_LOCAL_OUTPUT */
	/* LOCAL_CALL: a valid tool name, 1..SBX_TOOL_ARGS_MAX bytes of arguments, valid UTF-8 */
	const uint8_t *name;
	uint32_t name_len;
	const uint8_t *args;
	uint32_t args_len;
	/* LOCAL_OUTPUT: a valid mime type, then the data (the rest of the payload) */
	const uint8_t *mime;
	uint32_t mime_len;
	const uint8_t *data;
	uint32_t data_len;
};

/* TOOL_RESULT from the host. */
struct sbx_tool_result {
	uint32_t call;
	uint8_t status; /* SBX_TOOL_OK or SBX_TOOL_ERROR */
	const uint8_t *body;
	uint32_t body_len;
};

/* [A-Za-z_][A-Za-z0-9_]*, 1..SBX_TOOL_NAME_MAX bytes. */
bool sbx_tool_name_valid(const uint8_t *s, size_t n);
/* type/subtype: 1..SBX_MIME_TYPE_MAX bytes of [a-z0-9.+_-], exactly one '/', neither side empty. */
bool sbx_mime_type_valid(const uint8_t *s, size_t n);
/* Well-formed UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. */
bool sbx_utf8_valid(const uint8_t *s, size_t n);

/* A request frame's type and payload. 0, or -EPROTO/-EMSGSIZE with *why set to a static
 * explanation, which the agent sends back in its refusal. */
int sbx_parse_local_request(uint8_t type, const uint8_t *payload, size_t len,
			    struct sbx_local_request *req, const char **why);

/* TOOL_RESULT payload: u32 call (non-zero), u8 status (0/1), str body (<= SBX_TOOL_RESULT_MAX),
 * nothing after. 0, or -EPROTO/-EMSGSIZE with *why set. */
int sbx_parse_tool_result(const uint8_t *payload, size_t len, struct sbx_tool_result *res,
			  const char **why);

#endif /* SBX_HOST_REQUEST_GUEST_H */
