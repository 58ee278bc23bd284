/* Network wire decoding: see net_wire_guest.h. */
#include "net_wire_guest.h"

#include <errno.h>
#include <string.h>

static int fail(const char **why, const char *msg, int rc)
{
	if (why)
		*why = msg;
	return rc;
}

bool sbx_net_name_valid(const uint8_t *s, size_t n)
{
	if (n == 0 || n > SBX_NET_NAME_MAX)
		return false;
	size_t label = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		if (c == '.') {
			if (label == 0 || s[i - 1] == '-')
				return false;
			label = 0;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
			return false;
		if (c == '-' && label == 0)
			return false;
		if (++label > 63)
			return false;
	}
	return label > 0 && s[n - 1] != '-';
}

int sbx_net_parse_config(const uint8_t *p, size_t n, struct sbx_net_config *out, const char **why)
{
	struct sbx_cursor c = {p, n};
	uint32_t count;
	memset(out, 0, sizeof(*out));
	if (sbx_get_u32(&c, &out->flags) < 0)
		return fail(why, "truncated flags", -EPROTO);
	if (out->flags & ~(uint32_t)(SBX_NET_CONFIG_OUTBOUND | SBX_NET_CONFIG_REATTACH))
		return fail(why, "unknown flags", -EPROTO);
	if (sbx_get_u32(&c, &count) < 0)
		return fail(why, "truncated name count", -EPROTO);
	if (count > SBX_NET_NAMES_MAX)
		return fail(why, "too many names", -EMSGSIZE);
	for (uint32_t i = 0; i < count; i++) {
		const uint8_t *s;
		uint32_t len;
		int rc = sbx_get_str(&c, SBX_NET_NAME_MAX, &s, &len);
		if (rc < 0)
			return fail(why, "bad name", rc);
		if (!(len == 1 && s[0] == '*') && !sbx_net_name_valid(s, len))
			return fail(why, "invalid name", -EPROTO);
		out->names[i] = s;
		out->name_len[i] = len;
	}
	out->name_count = count;
	if (sbx_get_u32(&c, &count) < 0)
		return fail(why, "truncated port count", -EPROTO);
	if (count > SBX_NET_EXTRA_PORTS_MAX)
		return fail(why, "too many ports", -EMSGSIZE);
	for (uint32_t i = 0; i < count; i++) {
		uint32_t port;
		if (sbx_get_u32(&c, &port) < 0)
			return fail(why, "truncated port", -EPROTO);
		if (port < 1 || port > 65535)
			return fail(why, "port out of range", -EPROTO);
		/* 80 and 443 are always there; a repeated port would be bound twice. */
		bool dup = port == 80 || port == 443;
		for (uint32_t k = 0; k < out->port_count; k++)
			dup = dup || out->ports[k] == port;
		if (!dup)
			out->ports[out->port_count++] = (uint16_t)port;
	}
	const uint8_t *pem;
	uint32_t pem_len;
	int rc = sbx_get_str(&c, SBX_NET_CA_BUNDLE_MAX, &pem, &pem_len);
	if (rc < 0)
		return fail(why, "bad CA bundle", rc);
	if (memchr(pem, 0, pem_len))
		return fail(why, "NUL in the CA bundle", -EPROTO);
	out->ca_bundle = pem_len ? pem : NULL;
	out->ca_len = pem_len;
	if (c.left != 0)
		return fail(why, "trailing bytes", -EPROTO);
	return 0;
}

static bool host_id(uint32_t id)
{
	return (id & 0x80000000u) != 0;
}

int sbx_net_parse_host_frame(const struct sbx_frame *f, struct sbx_net_host_msg *out,
			     const char **why)
{
	struct sbx_cursor c = {f->payload, f->payload_len};
	memset(out, 0, sizeof(*out));
	out->type = f->type;
	out->id = f->id;
	if (f->id == 0)
		return fail(why, "stream id 0", -EPROTO);
	if (f->payload_len > SBX_NET_FRAME_MAX)
		return fail(why, "frame too large", -EPROTO);
	switch (f->type) {
	case SBX_NET_MSG_OPENED: {
		if (host_id(f->id))
			return fail(why, "OPENED for a host stream", -EPROTO);
		if (sbx_get_u32(&c, &out->value) < 0 || out->value > SBX_NET_STATUS_MAX)
			return fail(why, "bad OPENED status", -EPROTO);
		if (sbx_get_str(&c, SBX_NET_MESSAGE_MAX, &out->data, &out->len) < 0 || c.left)
			return fail(why, "bad OPENED reason", -EPROTO);
		return 0;
	}
	case SBX_NET_MSG_CONNECT:
		if (!host_id(f->id))
			return fail(why, "CONNECT with a guest stream id", -EPROTO);
		if (sbx_get_u32(&c, &out->value) < 0 || c.left || out->value < 1 ||
		    out->value > 65535)
			return fail(why, "bad CONNECT port", -EPROTO);
		return 0;
	case SBX_NET_MSG_DATA:
		if (f->payload_len < 1 || f->payload_len > SBX_NET_DATA_MAX)
			return fail(why, "DATA size out of range", -EPROTO);
		out->data = f->payload;
		out->len = f->payload_len;
		return 0;
	case SBX_NET_MSG_CREDIT:
		if (sbx_get_u32(&c, &out->value) < 0 || c.left || out->value < 1 ||
		    out->value > SBX_NET_WINDOW)
			return fail(why, "bad CREDIT", -EPROTO);
		return 0;
	case SBX_NET_MSG_SHUTDOWN:
		if (f->payload_len != 0)
			return fail(why, "SHUTDOWN carries no payload", -EPROTO);
		return 0;
	case SBX_NET_MSG_CLOSE:
		if (sbx_get_u32(&c, &out->value) < 0 || c.left || out->value > SBX_NET_CLOSE_RESET)
			return fail(why, "bad CLOSE", -EPROTO);
		return 0;
	default:
		return fail(why, "not a host->guest net frame", -EPROTO);
	}
}

bool sbx_net_name_allowed(const struct sbx_net_config *c, const uint8_t *name, size_t n)
{
	for (uint32_t i = 0; i < c->name_count; i++) {
		const uint8_t *p = c->names[i];
		size_t pl = c->name_len[i];
		if (pl == 1 && p[0] == '*')
			return true;
		if (n == pl && memcmp(name, p, n) == 0)
			return true;
		if (n > pl && name[n - pl - 1] == '.' && memcmp(name + n - pl, p, pl) == 0)
			return true;
	}
	return false;
}
