/* Decoding of host socket requests and of TOOL_RESULT: see host_request_guest.h. User code writes
 * the requests, so every length and every character is checked before the agent forwards a byte
 * of them to the host. */
#include "host_request_guest.h"

#include <errno.h>
#include <string.h>

#include "frame.h"

bool sbx_tool_name_valid(const uint8_t *s, size_t n)
{
	if (n == 0 || n > SBX_TOOL_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
		if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
			return false;
	}
	return true;
}

bool sbx_mime_type_valid(const uint8_t *s, size_t n)
{
	if (n == 0 || n > SBX_MIME_TYPE_MAX)
		return false;
	size_t slash = n;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		if (c == '/') {
			if (slash != n)
				return false; /* a second one */
			slash = i;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '+' ||
		      c == '_' || c == '-'))
			return false;
	}
	return slash != n && slash > 0 && slash < n - 1;
}

bool sbx_utf8_valid(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t len;
		uint32_t cp, min;
		if (c >= 0xc2 && c <= 0xdf) {
			len = 2, cp = c & 0x1fu, min = 0x80;
		} else if (c >= 0xe0 && c <= 0xef) {
			len = 3, cp = c & 0x0fu, min = 0x800;
		} else if (c >= 0xf0 && c <= 0xf4) {
			len = 4, cp = c & 0x07u, min = 0x10000;
		} else {
			return false; /* a continuation byte first, 0xc0/0xc1 (overlong) or past 0xf4 */
		}
		if (n - i < len)
			return false;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3fu);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += len;
	}
	return true;
}

static int parse_call(struct sbx_cursor *c, struct sbx_local_request *req, const char **why)
{
	int rc = sbx_get_str(c, SBX_TOOL_NAME_MAX, &req->name, &req->name_len);
	if (rc < 0) {
		*why = rc == -EMSGSIZE ? "tool name too long" : "truncated tool name";
		return rc;
	}
	if (!sbx_tool_name_valid(req->name, req->name_len)) {
		*why = "invalid tool name";
		return -EPROTO;
	}
	rc = sbx_get_str(c, SBX_TOOL_ARGS_MAX, &req->args, &req->args_len);
	if (rc < 0) {
		*why = rc == -EMSGSIZE ? "tool arguments too long" : "truncated tool arguments";
		return rc;
	}
	/* JSON text is never empty, and the host's decoder takes an empty TOOL_CALL for a broken
	 * agent (the VM's end): refused here, the client's own mistake. */
	if (req->args_len == 0) {
		*why = "empty tool arguments";
		return -EPROTO;
	}
	if (!sbx_utf8_valid(req->args, req->args_len)) {
		*why = "tool arguments are not UTF-8";
		return -EPROTO;
	}
	if (c->left != 0) {
		*why = "trailing bytes after the tool arguments";
		return -EPROTO;
	}
	return 0;
}

static int parse_output(struct sbx_cursor *c, struct sbx_local_request *req, const char **why)
{
	int rc = sbx_get_str(c, SBX_MIME_TYPE_MAX, &req->mime, &req->mime_len);
	if (rc < 0) {
		*why = rc == -EMSGSIZE ? "mime type too long" : "truncated mime type";
		return rc;
	}
	if (!sbx_mime_type_valid(req->mime, req->mime_len)) {
		*why = "invalid mime type";
		return -EPROTO;
	}
	if (c->left > SBX_OUTPUT_ITEM_MAX) {
		*why = "output data too large";
		return -EMSGSIZE;
	}
	req->data = c->p;
	req->data_len = (uint32_t)c->left;
	return 0;
}

int sbx_parse_local_request(uint8_t type, const uint8_t *payload, size_t len,
			    struct sbx_local_request *req, const char **why)
{
	struct sbx_cursor c = {payload, len};
	memset(req, 0, sizeof(*req));
	req->type = type;
	switch (type) {
	case SBX_LOCAL_CALL:
		return parse_call(&c, req, why);
	case SBX_LOCAL_OUTPUT:
		return parse_output(&c, req, why);
	default:
		*why = "unknown request type";
		return -EPROTO;
	}
}

int sbx_parse_tool_result(const uint8_t *payload, size_t len, struct sbx_tool_result *res,
			  const char **why)
{
	struct sbx_cursor c = {payload, len};
	memset(res, 0, sizeof(*res));
	if (sbx_get_u32(&c, &res->call) < 0 || sbx_get_u8(&c, &res->status) < 0) {
		*why = "truncated TOOL_RESULT";
		return -EPROTO;
	}
	if (res->call == 0) {
		*why = "call 0";
		return -EPROTO;
	}
	if (res->status != SBX_TOOL_OK && res->status != SBX_TOOL_ERROR) {
		*why = "unknown status";
		return -EPROTO;
	}
	int rc = sbx_get_str(&c, SBX_TOOL_RESULT_MAX, &res->body, &res->body_len);
	if (rc < 0) {
		*why = rc == -EMSGSIZE ? "body too long" : "truncated body";
		return rc;
	}
	if (c.left != 0) {
		*why = "trailing bytes after the body";
		return -EPROTO;
	}
	return 0;
}
