/* Decoding of host requests: see agent_request_guest.h. Every field is checked; anything odd is refused rather
 * than repaired, so that a host bug shows up as a BAD_REQUEST instead of a surprising run. */
#include "agent_request_guest.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "frame.h"

static bool valid_env_name(const uint8_t *s, uint32_t n)
{
	if (n == 0)
		return false;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
		if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
			return false;
	}
	return true;
}

/* The env part of EXEC and PROC_SPAWN: u32 count, then name/value pairs. */
static int parse_env(struct sbx_cursor *c, uint32_t *count, struct sbx_env_var *env,
		     const char **why)
{
	if (sbx_get_u32(c, count) < 0) {
		*why = "truncated environment count";
		return -EPROTO;
	}
	if (*count > SBX_ENV_MAX_COUNT) {
		*why = "too many environment variables";
		return -EMSGSIZE;
	}
	for (uint32_t i = 0; i < *count; i++) {
		struct sbx_env_var *v = &env[i];
		int rc = sbx_get_str(c, SBX_ENV_NAME_MAX, &v->name, &v->name_len);
		if (rc < 0) {
			*why = rc == -EMSGSIZE ? "environment variable name too long"
					       : "truncated environment variable name";
			return rc;
		}
		if (!valid_env_name(v->name, v->name_len)) {
			*why = "invalid environment variable name";
			return -EPROTO;
		}
		rc = sbx_get_str(c, SBX_ENV_VALUE_MAX, &v->value, &v->value_len);
		if (rc < 0) {
			*why = rc == -EMSGSIZE ? "environment variable value too long"
					       : "truncated environment variable value";
			return rc;
		}
		if (v->value_len && memchr(v->value, '\0', v->value_len)) {
			*why = "NUL byte in environment variable value";
			return -EPROTO;
		}
	}
	return 0;
}

int sbx_parse_exec(const uint8_t *payload, size_t len, struct sbx_exec_request *req,
		   const char **why)
{
	struct sbx_cursor c = {payload, len};
	int rc;

	memset(req, 0, sizeof(*req));
	if (sbx_get_u8(&c, &req->language) < 0 || sbx_get_u32(&c, &req->timeout_ms) < 0 ||
	    sbx_get_u32(&c, &req->stdout_limit) < 0 || sbx_get_u32(&c, &req->stderr_limit) < 0) {
		*why = "truncated EXEC header";
		return -EPROTO;
	}
	if (!sbx_language_valid(req->language)) {
		*why = "unknown language";
		return -EPROTO;
	}
	if (req->timeout_ms != SBX_TIMEOUT_NONE &&
	    (req->timeout_ms < SBX_TIMEOUT_MS_MIN || req->timeout_ms > SBX_TIMEOUT_MS_MAX)) {
		*why = "timeout_ms out of range 1..86400000 (or 0: none)";
		return -EPROTO;
	}
	rc = parse_env(&c, &req->env_count, req->env, why);
	if (rc < 0)
		return rc;
	rc = sbx_get_str(&c, SBX_CODE_MAX, &req->code, &req->code_len);
	if (rc < 0) {
		*why = rc == -EMSGSIZE ? "code too long" : "truncated code";
		return rc;
	}
	if (c.left != 0) {
		*why = "trailing bytes after EXEC payload";
		return -EPROTO;
	}
	return 0;
}

int sbx_parse_prestart(const uint8_t *payload, size_t len, uint8_t *language, const char **why)
{
	if (len != 1) {
		*why = "PRESTART carries exactly one byte";
		return -EPROTO;
	}
	if (!sbx_language_valid(payload[0])) {
		*why = "unknown language";
		return -EPROTO;
	}
	*language = payload[0];
	return 0;
}

int sbx_path_check(const uint8_t *path, uint32_t len, bool allow_empty)
{
	if (len > SBX_PATH_MAX || (len == 0 && !allow_empty))
		return -EINVAL;
	if (len && memchr(path, '\0', len))
		return -EINVAL;
	uint32_t start = 0;
	for (uint32_t i = 0; len && i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		uint32_t n = i - start;
		if (n == 0 || n > SBX_PATH_COMPONENT_MAX)
			return -EINVAL;
		if ((n == 1 && path[start] == '.') ||
		    (n == 2 && path[start] == '.' && path[start + 1] == '.'))
			return -EINVAL;
		start = i + 1;
	}
	return 0;
}

int sbx_parse_file_path(const uint8_t *payload, size_t len, bool with_u8, bool allow_empty,
			struct sbx_path_parts *p, uint8_t *extra)
{
	struct sbx_cursor c = {payload, len};
	const uint8_t *path;
	uint32_t path_len;
	if (sbx_get_str(&c, SBX_PATH_MAX, &path, &path_len) < 0)
		return -EPROTO;
	if (with_u8 && sbx_get_u8(&c, extra) < 0)
		return -EPROTO;
	if (c.left != 0)
		return -EPROTO;
	int rc = sbx_path_check(path, path_len, allow_empty);
	if (rc < 0)
		return rc;
	memcpy(p->buf, path, path_len);
	p->buf[path_len] = '\0';
	p->n = 0;
	char *save = NULL;
	for (char *comp = strtok_r(p->buf, "/", &save); comp; comp = strtok_r(NULL, "/", &save))
		p->comp[p->n++] = comp;
	return 0;
}

int sbx_parse_file_target(const uint8_t *payload, size_t len, uint8_t allowed,
			  struct sbx_path_parts *p, uint8_t *flags)
{
	int rc = sbx_parse_file_path(payload, len, true, true, p, flags);
	if (rc < 0)
		return rc;
	if (*flags & ~allowed)
		return -EPROTO;
	if (*flags & SBX_FILE_NODE_SNAPSHOT)
		return *flags == SBX_FILE_NODE_SNAPSHOT && p->n == 0 ? 0 : -EPROTO;
	return p->n > 0 ? 0 : -EINVAL;
}

/* --- PROC_* ---------------------------------------------------------------------------------- */

static int get_u16(struct sbx_cursor *c, uint16_t *v)
{
	uint8_t lo, hi;
	if (sbx_get_u8(c, &lo) < 0 || sbx_get_u8(c, &hi) < 0)
		return -EPROTO;
	*v = (uint16_t)(lo | (hi << 8));
	return 0;
}

static bool tty_size_valid(uint16_t cols, uint16_t rows)
{
	return cols >= 1 && cols <= SBX_PROC_TTY_MAX && rows >= 1 && rows <= SBX_PROC_TTY_MAX;
}

int sbx_parse_proc_spawn(const uint8_t *payload, size_t len, struct sbx_proc_spawn_request *req,
			 const char **why)
{
	struct sbx_cursor c = {payload, len};
	memset(req, 0, sizeof(*req));
	if (sbx_get_u8(&c, &req->flags) < 0 || get_u16(&c, &req->cols) < 0 ||
	    get_u16(&c, &req->rows) < 0 || sbx_get_u32(&c, &req->argc) < 0) {
		*why = "truncated PROC_SPAWN header";
		return -EPROTO;
	}
	if (req->flags & ~(unsigned)SBX_SPAWN_PTY) {
		*why = "unknown spawn flags";
		return -EPROTO;
	}
	if ((req->flags & SBX_SPAWN_PTY) ? !tty_size_valid(req->cols, req->rows)
					 : (req->cols != 0 || req->rows != 0)) {
		*why = "terminal size out of range (1..1000 with a pty, else 0)";
		return -EPROTO;
	}
	if (req->argc == 0 || req->argc > SBX_PROC_ARGV_MAX) {
		*why = "argc out of range 1..256";
		return req->argc ? -EMSGSIZE : -EPROTO;
	}
	for (uint32_t i = 0; i < req->argc; i++) {
		struct sbx_bytes *a = &req->argv[i];
		int rc = sbx_get_str(&c, SBX_PROC_ARG_MAX, &a->p, &a->n);
		if (rc < 0) {
			*why = rc == -EMSGSIZE ? "argument too long" : "truncated argument";
			return rc;
		}
		if (a->n == 0 || memchr(a->p, '\0', a->n)) {
			*why = "empty argument or NUL byte in an argument";
			return -EPROTO;
		}
	}
	int rc = sbx_get_str(&c, SBX_PATH_MAX, &req->cwd.p, &req->cwd.n);
	if (rc < 0) {
		*why = rc == -EMSGSIZE ? "cwd too long" : "truncated cwd";
		return rc;
	}
	if (req->cwd.n && (req->cwd.p[0] != '/' || memchr(req->cwd.p, '\0', req->cwd.n))) {
		*why = "cwd is not an absolute path";
		return -EPROTO;
	}
	rc = parse_env(&c, &req->env_count, req->env, why);
	if (rc < 0)
		return rc;
	if (c.left != 0) {
		*why = "trailing bytes after PROC_SPAWN payload";
		return -EPROTO;
	}
	return 0;
}

int sbx_parse_proc_request(uint8_t type, const uint8_t *payload, size_t len,
			   struct sbx_proc_request *req, const char **why)
{
	struct sbx_cursor c = {payload, len};
	memset(req, 0, sizeof(*req));
	req->type = type;
	if (type != SBX_MSG_PROC_LIST && sbx_get_u32(&c, &req->pid) < 0) {
		*why = "truncated pid";
		return -EPROTO;
	}
	*why = "truncated payload";
	switch (type) {
	case SBX_MSG_PROC_READ:
		if (sbx_get_u8(&c, &req->stream) < 0 || sbx_get_u64(&c, &req->offset) < 0 ||
		    sbx_get_u32(&c, &req->max) < 0 || sbx_get_u32(&c, &req->wait_ms) < 0)
			return -EPROTO;
		if (req->stream != SBX_PROC_STDOUT && req->stream != SBX_PROC_STDERR) {
			*why = "unknown stream";
			return -EPROTO;
		}
		if (req->max == 0 || req->max > SBX_OUTPUT_CHUNK_MAX) {
			*why = "max bytes out of range 1..32768";
			return -EPROTO;
		}
		break;
	case SBX_MSG_PROC_WRITE:
		if (sbx_get_u8(&c, &req->flags) < 0)
			return -EPROTO;
		if (req->flags & ~(unsigned)SBX_PROC_CLOSE_STDIN) {
			*why = "unknown write flags";
			return -EPROTO;
		}
		if (c.left > SBX_PROC_WRITE_MAX) {
			*why = "write larger than 61440 bytes";
			return -EMSGSIZE;
		}
		req->data.p = c.p;
		req->data.n = (uint32_t)c.left;
		c.left = 0;
		break;
	case SBX_MSG_PROC_SIGNAL:
		if (sbx_get_u32(&c, &req->signal) < 0)
			return -EPROTO;
		if (req->signal < 1 || req->signal > 64) {
			*why = "signal out of range 1..64";
			return -EPROTO;
		}
		break;
	case SBX_MSG_PROC_WAIT:
		if (sbx_get_u32(&c, &req->wait_ms) < 0)
			return -EPROTO;
		break;
	case SBX_MSG_PROC_LIST:
		break;
	case SBX_MSG_PROC_RESIZE:
		if (get_u16(&c, &req->cols) < 0 || get_u16(&c, &req->rows) < 0)
			return -EPROTO;
		if (!tty_size_valid(req->cols, req->rows)) {
			*why = "terminal size out of range 1..1000";
			return -EPROTO;
		}
		break;
	default:
		*why = "not a process request";
		return -EPROTO;
	}
	if (req->wait_ms > SBX_PROC_WAIT_MS_MAX) {
		*why = "wait_ms over 60000";
		return -EPROTO;
	}
	if (c.left != 0) {
		*why = "trailing bytes after the payload";
		return -EPROTO;
	}
	if (type != SBX_MSG_PROC_LIST && req->pid == 0) {
		*why = "pid 0";
		return -EPROTO;
	}
	return 0;
}
