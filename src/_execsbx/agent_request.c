/* Encoding of host -> guest frames. The guest re-validates everything; checking here too turns a
 * caller's mistake into a clear error instead of an ERROR(BAD_REQUEST) from the guest. */
#include "agent_request.h"

#include <errno.h>
#include <string.h>

static int fail(const char **why, const char *msg, int err)
{
	if (why)
		*why = msg;
	return err;
}

static int validate(const struct sbx_exec_req *r, const char **why)
{
	if (!sbx_language_valid(r->language))
		return fail(why, "unknown language", -EINVAL);
	if (r->timeout_ms < SBX_TIMEOUT_MS_MIN || r->timeout_ms > SBX_TIMEOUT_MS_MAX)
		return fail(why, "timeout_ms out of range (1 .. 300000)", -EINVAL);
	if (r->code_len > SBX_CODE_MAX)
		return fail(why, "code longer than CODE_MAX", -EMSGSIZE);
	if (r->env_count > SBX_ENV_MAX_COUNT)
		return fail(why, "more than 100 environment variables", -EMSGSIZE);
	for (size_t i = 0; i < r->env_count; i++) {
		const struct sbx_env_var *e = &r->env[i];
		if (e->name_len == 0)
			return fail(why, "empty environment variable name", -EINVAL);
		if (e->name_len > SBX_ENV_NAME_MAX)
			return fail(why, "environment variable name too long", -EMSGSIZE);
		if (e->value_len > SBX_ENV_VALUE_MAX)
			return fail(why, "environment variable value too long", -EMSGSIZE);
		if (memchr(e->name, '=', e->name_len) || memchr(e->name, 0, e->name_len))
			return fail(why, "environment variable name contains '=' or NUL", -EINVAL);
		if (e->value_len && memchr(e->value, 0, e->value_len))
			return fail(why, "environment variable value contains NUL", -EINVAL);
	}
	return 0;
}

int sbx_encode_exec(struct sbx_buf *b, const struct sbx_exec_req *r, const char **why)
{
	size_t start;
	int rc = validate(r, why);
	if (rc < 0)
		return rc;
	size_t before = b->len;
	rc = sbx_frame_begin(b, r->session ? SBX_MSG_SESSION_EXEC : SBX_MSG_EXEC, r->id, &start);
	if (rc == 0)
		rc = sbx_put_u8(b, (uint8_t)r->language);
	if (rc == 0)
		rc = sbx_put_u32(b, r->timeout_ms);
	if (rc == 0)
		rc = sbx_put_u32(b, r->stdout_limit);
	if (rc == 0)
		rc = sbx_put_u32(b, r->stderr_limit);
	if (rc == 0)
		rc = sbx_put_u32(b, (uint32_t)r->env_count);
	for (size_t i = 0; rc == 0 && i < r->env_count; i++) {
		rc = sbx_put_str(b, r->env[i].name, r->env[i].name_len);
		if (rc == 0)
			rc = sbx_put_str(b, r->env[i].value, r->env[i].value_len);
	}
	if (rc == 0)
		rc = sbx_put_str(b, r->code, r->code_len);
	if (rc == 0)
		rc = sbx_frame_end(b, start, SBX_HOST_FRAME_MAX);
	if (rc < 0) {
		b->len = before; /* drop the partial frame */
		return fail(why, rc == -EMSGSIZE ? "EXEC frame larger than HOST_FRAME_MAX" : "out of memory", rc);
	}
	return 0;
}

int sbx_encode_ping(struct sbx_buf *b, uint32_t id)
{
	size_t start;
	size_t before = b->len;
	int rc = sbx_frame_begin(b, SBX_MSG_PING, id, &start);
	if (rc == 0)
		rc = sbx_frame_end(b, start, 0);
	if (rc < 0)
		b->len = before;
	return rc;
}

int sbx_encode_reseed(struct sbx_buf *b, uint32_t id, const uint8_t *seed, size_t n,
		      uint64_t realtime_ns)
{
	size_t start;
	size_t before = b->len;
	if (n != SBX_RESEED_BYTES)
		return -EINVAL;
	int rc = sbx_frame_begin(b, SBX_MSG_RESEED, id, &start);
	if (rc == 0)
		rc = sbx_buf_append(b, seed, n);
	if (rc == 0)
		rc = sbx_put_u64(b, realtime_ns);
	if (rc == 0)
		rc = sbx_frame_end(b, start, SBX_RESEED_PAYLOAD_SIZE);
	if (rc < 0)
		b->len = before;
	return rc;
}

int sbx_encode_prestart(struct sbx_buf *b, uint32_t id, uint8_t language)
{
	if (!sbx_language_valid(language))
		return -EINVAL;
	size_t start;
	size_t before = b->len;
	int rc = sbx_frame_begin(b, SBX_MSG_PRESTART, id, &start);
	if (rc == 0)
		rc = sbx_buf_append(b, &language, 1);
	if (rc == 0)
		rc = sbx_frame_end(b, start, 1);
	if (rc < 0)
		b->len = before;
	return rc;
}

int sbx_encode_file_frame(struct sbx_buf *b, uint8_t type, uint32_t id, const void *payload,
			  size_t len)
{
	if (type < SBX_MSG_FILE_WRITE_BEGIN || type > SBX_MSG_FILE_LIST)
		return -EINVAL;
	if (len > SBX_HOST_FRAME_MAX)
		return -EMSGSIZE;
	size_t start;
	int rc = sbx_frame_begin(b, type, id, &start);
	if (rc < 0)
		return rc;
	if (len > 0 && (rc = sbx_buf_append(b, payload, len)) < 0) {
		b->len = start;
		return rc;
	}
	return sbx_frame_end(b, start, SBX_HOST_FRAME_MAX);
}
