/* Encoding of host -> guest frames. The guest re-validates everything; checking here too turns a
 * caller's mistake into a clear error instead of an ERROR(BAD_REQUEST) from the guest. */
#include "agent_request.h"

#include "net_protocol.h"

#include <errno.h>
#include <string.h>

static int fail(struct sbx_err *err, const char *msg, int code)
{
	return sbx_err_set(err, code, "%s", msg);
}

static int validate_env(const struct sbx_env_var *env, size_t count, struct sbx_err *err)
{
	if (count > SBX_ENV_MAX_COUNT)
		return fail(err, "more than 100 environment variables", -EMSGSIZE);
	for (size_t i = 0; i < count; i++) {
		const struct sbx_env_var *e = &env[i];
		if (e->name_len == 0)
			return fail(err, "empty environment variable name", -EINVAL);
		if (e->name_len > SBX_ENV_NAME_MAX)
			return fail(err, "environment variable name too long", -EMSGSIZE);
		if (e->value_len > SBX_ENV_VALUE_MAX)
			return fail(err, "environment variable value too long", -EMSGSIZE);
		if (memchr(e->name, '=', e->name_len) || memchr(e->name, 0, e->name_len))
			return fail(err, "environment variable name contains '=' or NUL", -EINVAL);
		if (e->value_len && memchr(e->value, 0, e->value_len))
			return fail(err, "environment variable value contains NUL", -EINVAL);
	}
	return 0;
}

static int validate(const struct sbx_exec_req *r, struct sbx_err *err)
{
	if (!sbx_language_valid(r->language))
		return fail(err, "unknown language", -EINVAL);
	if (r->timeout_ms != SBX_TIMEOUT_NONE &&
	    (r->timeout_ms < SBX_TIMEOUT_MS_MIN || r->timeout_ms > SBX_TIMEOUT_MS_MAX))
		return fail(err, "timeout_ms out of range (1 .. 86400000, or 0: none)", -EINVAL);
	if (r->code_len > SBX_CODE_MAX)
		return fail(err, "code longer than CODE_MAX", -EMSGSIZE);
	return validate_env(r->env, r->env_count, err);
}

int sbx_encode_exec(struct sbx_buf *b, const struct sbx_exec_req *r, struct sbx_err *err)
{
	size_t start;
	int rc = validate(r, err);
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
		return fail(err, rc == -EMSGSIZE ? "EXEC frame larger than HOST_FRAME_MAX" : "out of memory", rc);
	}
	return 0;
}

int sbx_encode_ping(struct sbx_buf *b, uint32_t id, struct sbx_err *err)
{
	size_t start;
	size_t before = b->len;
	int rc = sbx_frame_begin(b, SBX_MSG_PING, id, &start);
	if (rc == 0)
		rc = sbx_frame_end(b, start, 0);
	if (rc < 0) {
		b->len = before;
		return fail(err, "out of memory", rc);
	}
	return 0;
}

int sbx_encode_reseed(struct sbx_buf *b, uint32_t id, const uint8_t *seed, size_t n,
		      uint64_t realtime_ns, struct sbx_err *err)
{
	size_t start;
	size_t before = b->len;
	if (n != SBX_RESEED_BYTES)
		return sbx_err_set(err, -EINVAL, "seed must be %u bytes", SBX_RESEED_BYTES);
	int rc = sbx_frame_begin(b, SBX_MSG_RESEED, id, &start);
	if (rc == 0)
		rc = sbx_buf_append(b, seed, n);
	if (rc == 0)
		rc = sbx_put_u64(b, realtime_ns);
	if (rc == 0)
		rc = sbx_frame_end(b, start, SBX_RESEED_PAYLOAD_SIZE);
	if (rc < 0) {
		b->len = before;
		return fail(err, "out of memory", rc);
	}
	return 0;
}

int sbx_encode_prestart(struct sbx_buf *b, uint32_t id, uint8_t language, struct sbx_err *err)
{
	if (!sbx_language_valid(language))
		return sbx_err_set(err, -EINVAL, "unknown language %u", language);
	size_t start;
	size_t before = b->len;
	int rc = sbx_frame_begin(b, SBX_MSG_PRESTART, id, &start);
	if (rc == 0)
		rc = sbx_buf_append(b, &language, 1);
	if (rc == 0)
		rc = sbx_frame_end(b, start, 1);
	if (rc < 0) {
		b->len = before;
		return fail(err, "out of memory", rc);
	}
	return 0;
}

static int validate_file(const struct sbx_file_req *r, struct sbx_err *err)
{
	int with_path = r->type == SBX_MSG_FILE_WRITE_BEGIN || r->type == SBX_MSG_FILE_READ ||
			r->type == SBX_MSG_FILE_LIST;
	switch (r->type) {
	case SBX_MSG_FILE_WRITE_BEGIN:
	case SBX_MSG_FILE_READ:
		if (r->flag & ~(r->type == SBX_MSG_FILE_READ
					? (unsigned)SBX_FILE_NODE_SNAPSHOT
					: (unsigned)(SBX_FILE_EXECUTABLE | SBX_FILE_NODE_SNAPSHOT)))
			return fail(err, "unknown file flag", -EINVAL);
		if (r->flag & SBX_FILE_NODE_SNAPSHOT) {
			/* Named by the flag alone (protocol.h). */
			if (r->flag != SBX_FILE_NODE_SNAPSHOT || r->path_len != 0)
				return fail(err, "node's startup snapshot takes no path and no "
						 "other flag", -EINVAL);
			return 0;
		}
		break;
	case SBX_MSG_FILE_WRITE_DATA:
		if (r->data_len > SBX_HOST_FRAME_MAX)
			return fail(err, "payload larger than HOST_FRAME_MAX", -EMSGSIZE);
		break;
	case SBX_MSG_FILE_WRITE_END:
		if (r->flag > 1)
			return fail(err, "FILE_WRITE_END is commit (1) or abort (0)", -EINVAL);
		break;
	case SBX_MSG_FILE_LIST:
		break;
	default:
		return fail(err, "not a file-transfer message type", -EINVAL);
	}
	if (!with_path)
		return 0;
	if (r->path_len > SBX_PATH_MAX)
		return fail(err, "path longer than PATH_MAX", -EMSGSIZE);
	if (r->path_len == 0 && r->type != SBX_MSG_FILE_LIST)
		return fail(err, "empty path", -EINVAL);
	if (r->path_len && memchr(r->path, 0, r->path_len))
		return fail(err, "path contains NUL", -EINVAL);
	return 0;
}

int sbx_encode_file_request(struct sbx_buf *b, const struct sbx_file_req *r, struct sbx_err *err)
{
	int rc = validate_file(r, err);
	if (rc < 0)
		return rc;
	size_t start, before = b->len;
	rc = sbx_frame_begin(b, r->type, r->id, &start);
	if (rc == 0) {
		switch (r->type) {
		case SBX_MSG_FILE_WRITE_BEGIN:
		case SBX_MSG_FILE_READ:
			rc = sbx_put_str(b, r->path, r->path_len);
			if (rc == 0)
				rc = sbx_put_u8(b, r->flag);
			break;
		case SBX_MSG_FILE_WRITE_DATA:
			if (r->data_len > 0)
				rc = sbx_buf_append(b, r->data, r->data_len);
			break;
		case SBX_MSG_FILE_WRITE_END:
			rc = sbx_put_u8(b, r->flag);
			break;
		default: /* LIST */
			rc = sbx_put_str(b, r->path, r->path_len);
			break;
		}
	}
	if (rc == 0)
		rc = sbx_frame_end(b, start, SBX_HOST_FRAME_MAX);
	if (rc < 0) {
		b->len = before; /* drop the partial frame */
		return fail(err, rc == -EMSGSIZE ? "FILE frame larger than HOST_FRAME_MAX"
						 : "out of memory", rc);
	}
	return 0;
}

int sbx_encode_tool_result(struct sbx_buf *b, const struct sbx_tool_result_req *r,
			   struct sbx_err *err)
{
	if (r->call == 0)
		return fail(err, "call 0 is no tool call", -EINVAL);
	if (r->status != SBX_TOOL_OK && r->status != SBX_TOOL_ERROR)
		return sbx_err_set(err, -EINVAL, "tool status %u is neither 0 (ok) nor 1 (error)",
				   r->status);
	if (r->body_len > SBX_TOOL_RESULT_MAX)
		return sbx_err_set(err, -EMSGSIZE, "tool result over 1 MiB (%zu bytes)", r->body_len);
	size_t start, before = b->len;
	int rc = sbx_frame_begin(b, SBX_MSG_TOOL_RESULT, r->id, &start);
	if (rc == 0)
		rc = sbx_put_u32(b, r->call);
	if (rc == 0)
		rc = sbx_put_u8(b, (uint8_t)r->status);
	if (rc == 0)
		rc = sbx_put_str(b, r->body, r->body_len);
	if (rc == 0) /* 1 MiB and 9 bytes: far below the frame's own limit, checked all the same */
		rc = sbx_frame_end(b, start, SBX_HOST_FRAME_MAX);
	if (rc < 0) {
		b->len = before; /* drop the partial frame */
		return fail(err, rc == -EMSGSIZE ? "TOOL_RESULT frame larger than HOST_FRAME_MAX"
						 : "out of memory", rc);
	}
	return 0;
}

/* "*" alone, or a lowercase DNS name: labels of 1..63 letters, digits and inner hyphens, no
 * trailing dot (the guest's rule for a pattern). */
static int pattern_ok(const uint8_t *s, size_t n)
{
	if (n == 1 && s[0] == '*')
		return 1;
	size_t label = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		if (c == '.') {
			if (label == 0 || s[i - 1] == '-')
				return 0;
			label = 0;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
			return 0;
		if ((c == '-' && label == 0) || ++label > 63)
			return 0;
	}
	return label > 0 && s[n - 1] != '-';
}

static int validate_net_config(const struct sbx_net_config_req *r, struct sbx_err *err)
{
	if (r->name_count > SBX_NET_NAMES_MAX)
		return sbx_err_set(err, -EMSGSIZE, "more than %u names", SBX_NET_NAMES_MAX);
	for (size_t i = 0; i < r->name_count; i++) {
		const struct sbx_bytes *n = &r->names[i];
		if (n->len > SBX_NET_NAME_MAX)
			return sbx_err_set(err, -EMSGSIZE, "name %zu longer than %u bytes", i,
					   SBX_NET_NAME_MAX);
		if (!pattern_ok(n->data, n->len))
			return sbx_err_set(err, -EINVAL, "name %zu is not a lowercase DNS name or \"*\"",
					   i);
	}
	if (r->port_count > SBX_NET_EXTRA_PORTS_MAX)
		return sbx_err_set(err, -EMSGSIZE, "more than %u extra ports",
				   SBX_NET_EXTRA_PORTS_MAX);
	for (size_t i = 0; i < r->port_count; i++)
		if (r->ports[i] < 1 || r->ports[i] > 65535)
			return sbx_err_set(err, -EINVAL, "port %u outside 1..65535", r->ports[i]);
	if (r->ca_len > SBX_NET_CA_BUNDLE_MAX)
		return sbx_err_set(err, -EMSGSIZE, "CA bundle larger than %u bytes",
				   SBX_NET_CA_BUNDLE_MAX);
	if (r->ca_len && memchr(r->ca_bundle, 0, r->ca_len))
		return fail(err, "CA bundle contains NUL", -EINVAL);
	return 0;
}

int sbx_encode_net_config(struct sbx_buf *b, const struct sbx_net_config_req *r,
			  struct sbx_err *err)
{
	int rc = validate_net_config(r, err);
	if (rc < 0)
		return rc;
	size_t start, before = b->len;
	rc = sbx_frame_begin(b, SBX_MSG_NET_CONFIG, r->id, &start);
	if (rc == 0)
		rc = sbx_put_u32(b, (r->outbound ? (uint32_t)SBX_NET_CONFIG_OUTBOUND : 0u) |
					    (r->reattach ? (uint32_t)SBX_NET_CONFIG_REATTACH : 0u));
	if (rc == 0)
		rc = sbx_put_u32(b, (uint32_t)r->name_count);
	for (size_t i = 0; rc == 0 && i < r->name_count; i++)
		rc = sbx_put_str(b, r->names[i].data, r->names[i].len);
	if (rc == 0)
		rc = sbx_put_u32(b, (uint32_t)r->port_count);
	for (size_t i = 0; rc == 0 && i < r->port_count; i++)
		rc = sbx_put_u32(b, r->ports[i]);
	if (rc == 0)
		rc = sbx_put_str(b, r->ca_bundle, r->ca_len);
	if (rc == 0) /* the limits above keep it far below; the frame's own limit all the same */
		rc = sbx_frame_end(b, start, SBX_HOST_FRAME_MAX);
	if (rc < 0) {
		b->len = before; /* drop the partial frame */
		return fail(err, rc == -EMSGSIZE ? "NET_CONFIG frame larger than HOST_FRAME_MAX"
						 : "out of memory", rc);
	}
	return 0;
}

static int tty_size_ok(uint32_t cols, uint32_t rows)
{
	return cols >= 1 && cols <= SBX_PROC_TTY_MAX && rows >= 1 && rows <= SBX_PROC_TTY_MAX;
}

static int validate_spawn(const struct sbx_proc_req *r, struct sbx_err *err)
{
	if (r->flags & ~(unsigned)SBX_SPAWN_PTY)
		return fail(err, "unknown spawn flag", -EINVAL);
	if ((r->flags & SBX_SPAWN_PTY) ? !tty_size_ok(r->cols, r->rows) : (r->cols || r->rows))
		return fail(err, "terminal size out of range (1..1000 with a pty, else 0)", -EINVAL);
	if (r->argc < 1)
		return fail(err, "empty argv", -EINVAL);
	if (r->argc > SBX_PROC_ARGV_MAX)
		return sbx_err_set(err, -EMSGSIZE, "more than %u arguments", SBX_PROC_ARGV_MAX);
	for (size_t i = 0; i < r->argc; i++) {
		const struct sbx_bytes *a = &r->argv[i];
		if (a->len == 0)
			return sbx_err_set(err, -EINVAL, "argument %zu is empty", i);
		if (a->len > SBX_PROC_ARG_MAX)
			return sbx_err_set(err, -EMSGSIZE, "argument %zu longer than %u bytes", i,
					   SBX_PROC_ARG_MAX);
		if (memchr(a->data, 0, a->len))
			return sbx_err_set(err, -EINVAL, "argument %zu contains NUL", i);
	}
	if (r->cwd_len > SBX_PATH_MAX)
		return fail(err, "cwd longer than PATH_MAX", -EMSGSIZE);
	if (r->cwd_len && (r->cwd[0] != '/' || memchr(r->cwd, 0, r->cwd_len)))
		return fail(err, "cwd must be an absolute path without NUL", -EINVAL);
	return validate_env(r->env, r->env_count, err);
}

static int validate_proc(const struct sbx_proc_req *r, struct sbx_err *err)
{
	switch (r->type) {
	case SBX_MSG_PROC_SPAWN:
		return validate_spawn(r, err);
	case SBX_MSG_PROC_READ:
		if (r->stream != SBX_PROC_STDOUT && r->stream != SBX_PROC_STDERR)
			return fail(err, "stream must be 1 (stdout) or 2 (stderr)", -EINVAL);
		if (r->max < 1 || r->max > SBX_OUTPUT_CHUNK_MAX)
			return fail(err, "max bytes out of range (1..OUTPUT_CHUNK_MAX)", -EINVAL);
		break;
	case SBX_MSG_PROC_WRITE:
		if (r->flags & ~(unsigned)SBX_PROC_CLOSE_STDIN)
			return fail(err, "unknown write flag", -EINVAL);
		if (r->data_len > SBX_PROC_WRITE_MAX)
			return fail(err, "write larger than PROC_WRITE_MAX", -EMSGSIZE);
		break;
	case SBX_MSG_PROC_SIGNAL:
		if (r->signal < 1 || r->signal > 64)
			return fail(err, "signal out of range (1..64)", -EINVAL);
		break;
	case SBX_MSG_PROC_WAIT:
	case SBX_MSG_PROC_LIST:
		break;
	case SBX_MSG_PROC_RESIZE:
		if (!tty_size_ok(r->cols, r->rows))
			return fail(err, "terminal size out of range (1..1000)", -EINVAL);
		break;
	default:
		return fail(err, "not a process message type", -EINVAL);
	}
	if ((r->type == SBX_MSG_PROC_READ || r->type == SBX_MSG_PROC_WAIT) &&
	    r->wait_ms > SBX_PROC_WAIT_MS_MAX)
		return fail(err, "wait_ms over PROC_WAIT_MS_MAX", -EINVAL);
	return 0;
}

static int put_u16(struct sbx_buf *b, uint16_t v)
{
	uint8_t le[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
	return sbx_buf_append(b, le, 2);
}

static int put_spawn(struct sbx_buf *b, const struct sbx_proc_req *r)
{
	int rc = sbx_put_u8(b, r->flags);
	if (rc == 0)
		rc = put_u16(b, r->cols);
	if (rc == 0)
		rc = put_u16(b, r->rows);
	if (rc == 0)
		rc = sbx_put_u32(b, (uint32_t)r->argc);
	for (size_t i = 0; rc == 0 && i < r->argc; i++)
		rc = sbx_put_str(b, r->argv[i].data, r->argv[i].len);
	if (rc == 0)
		rc = sbx_put_str(b, r->cwd, r->cwd_len);
	if (rc == 0)
		rc = sbx_put_u32(b, (uint32_t)r->env_count);
	for (size_t i = 0; rc == 0 && i < r->env_count; i++) {
		rc = sbx_put_str(b, r->env[i].name, r->env[i].name_len);
		if (rc == 0)
			rc = sbx_put_str(b, r->env[i].value, r->env[i].value_len);
	}
	return rc;
}

int sbx_encode_proc_request(struct sbx_buf *b, const struct sbx_proc_req *r, struct sbx_err *err)
{
	int rc = validate_proc(r, err);
	if (rc < 0)
		return rc;
	size_t start, before = b->len;
	rc = sbx_frame_begin(b, r->type, r->id, &start);
	if (rc == 0 && r->type != SBX_MSG_PROC_SPAWN && r->type != SBX_MSG_PROC_LIST)
		rc = sbx_put_u32(b, r->pid);
	if (rc == 0) {
		switch (r->type) {
		case SBX_MSG_PROC_SPAWN:
			rc = put_spawn(b, r);
			break;
		case SBX_MSG_PROC_READ:
			rc = sbx_put_u8(b, r->stream);
			if (rc == 0)
				rc = sbx_put_u64(b, r->offset);
			if (rc == 0)
				rc = sbx_put_u32(b, r->max);
			if (rc == 0)
				rc = sbx_put_u32(b, r->wait_ms);
			break;
		case SBX_MSG_PROC_WRITE:
			/* The data is the rest of the payload, as in OUTPUT and PROC_DATA. */
			rc = sbx_put_u8(b, r->flags);
			if (rc == 0 && r->data_len)
				rc = sbx_buf_append(b, r->data, r->data_len);
			break;
		case SBX_MSG_PROC_SIGNAL:
			rc = sbx_put_u32(b, r->signal);
			break;
		case SBX_MSG_PROC_WAIT:
			rc = sbx_put_u32(b, r->wait_ms);
			break;
		case SBX_MSG_PROC_RESIZE:
			rc = put_u16(b, r->cols);
			if (rc == 0)
				rc = put_u16(b, r->rows);
			break;
		default: /* LIST: empty */
			break;
		}
	}
	if (rc == 0)
		rc = sbx_frame_end(b, start, SBX_HOST_FRAME_MAX);
	if (rc < 0) {
		b->len = before; /* drop the partial frame */
		return fail(err, rc == -EMSGSIZE ? "PROC frame larger than HOST_FRAME_MAX"
						 : "out of memory", rc);
	}
	return 0;
}
