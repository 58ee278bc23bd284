/* See net_wire.h. Every field is checked against the bytes left and its hard limit. */
#include "net_wire.h"

#include <errno.h>
#include <string.h>

#define HOST_STREAM_BIT 0x80000000u

int sbx_net_name_ok(const uint8_t *name, uint32_t len)
{
	if (len == 0 || len > SBX_NET_NAME_MAX || name[0] == '.' || name[len - 1] == '.')
		return 0;
	for (uint32_t i = 0; i < len; i++) {
		uint8_t c = name[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
		if (!ok || (c == '.' && name[i + 1] == '.'))
			return 0;
	}
	return 1;
}

int sbx_net_address_ok(const uint8_t *text, uint32_t len)
{
	uint32_t parts = 0, i = 0;
	if (len == 0 || len > SBX_NET_ADDRESS_TEXT_MAX)
		return 0;
	for (;;) {
		uint32_t start = i, value = 0;
		while (i < len && text[i] >= '0' && text[i] <= '9' && i - start < 3)
			value = value * 10 + (uint32_t)(text[i++] - '0');
		if (i == start || value > 255 || (text[start] == '0' && i - start > 1))
			return 0;
		if (++parts == 4)
			return i == len;
		if (i == len || text[i] != '.')
			return 0;
		i++;
	}
}

/* A u32 field, or -EPROTO with err naming it. */
static int get_u32(struct sbx_cursor *c, uint32_t *v, const char *field, struct sbx_err *err)
{
	if (sbx_get_u32(c, v) < 0)
		return sbx_err_set(err, -EPROTO, "%s truncated", field);
	return 0;
}

/* The payload must have been read whole. */
static int finished(const struct sbx_cursor *c, struct sbx_err *err)
{
	if (c->left != 0)
		return sbx_err_set(err, -EPROTO, "%zu trailing bytes", c->left);
	return 0;
}

int sbx_net_decode(const struct sbx_frame *f, struct sbx_net_frame *out, struct sbx_err *err)
{
	struct sbx_cursor c = {f->payload, f->payload_len};
	int rc;

	memset(out, 0, sizeof(*out));
	out->type = f->type;
	out->stream = f->id;
	if (f->type == SBX_NET_MSG_REFUSED) {
		if (f->id != 0)
			return sbx_err_set(err, -EPROTO, "REFUSED with stream id %u", f->id);
	} else if (f->id == 0) {
		return sbx_err_set(err, -EPROTO, "stream id 0");
	}
	if (f->payload_len > SBX_NET_FRAME_MAX)
		return sbx_err_set(err, -EMSGSIZE, "payload of %u bytes over %u", f->payload_len,
				   SBX_NET_FRAME_MAX);
	switch (f->type) {
	case SBX_NET_MSG_OPEN:
		if (f->id & HOST_STREAM_BIT)
			return sbx_err_set(err, -EPROTO, "OPEN with a host stream id");
		if ((rc = get_u32(&c, &out->value, "OPEN port", err)) < 0)
			return rc;
		if (out->value == 0 || out->value > 65535)
			return sbx_err_set(err, -EPROTO, "OPEN port %u out of 1..65535", out->value);
		rc = sbx_get_str(&c, SBX_NET_NAME_MAX, &out->data, &out->len);
		if (rc == -EMSGSIZE)
			return sbx_err_set(err, rc, "OPEN name over %u bytes", SBX_NET_NAME_MAX);
		if (rc < 0)
			return sbx_err_set(err, rc, "OPEN name truncated");
		if (!sbx_net_name_ok(out->data, out->len))
			return sbx_err_set(err, -EPROTO, "OPEN name not a lowercase DNS name");
		return finished(&c, err);
	case SBX_NET_MSG_CONNECTED:
		if (!(f->id & HOST_STREAM_BIT))
			return sbx_err_set(err, -EPROTO, "CONNECTED with a guest stream id");
		if ((rc = get_u32(&c, &out->value, "CONNECTED status", err)) < 0)
			return rc;
		if (out->value > SBX_NET_STATUS_MAX)
			return sbx_err_set(err, -EPROTO, "CONNECTED status %u unknown", out->value);
		return finished(&c, err);
	case SBX_NET_MSG_REFUSED:
		if ((rc = get_u32(&c, &out->value, "REFUSED what", err)) < 0 ||
		    (rc = get_u32(&c, &out->port, "REFUSED port", err)) < 0 ||
		    (rc = get_u32(&c, &out->count, "REFUSED count", err)) < 0)
			return rc;
		rc = sbx_get_str(&c, SBX_NET_NAME_MAX, &out->data, &out->len);
		if (rc == -EMSGSIZE)
			return sbx_err_set(err, rc, "REFUSED subject over %u bytes", SBX_NET_NAME_MAX);
		if (rc < 0)
			return sbx_err_set(err, rc, "REFUSED subject truncated");
		switch (out->value) {
		case SBX_NET_REFUSAL_NAME:
			if (out->port != 0 || out->count != 1 || !sbx_net_name_ok(out->data, out->len))
				return sbx_err_set(err, -EPROTO, "REFUSED name malformed");
			break;
		case SBX_NET_REFUSAL_ADDRESS:
			if (out->port == 0 || out->port > 65535 || out->count != 1 ||
			    !sbx_net_address_ok(out->data, out->len))
				return sbx_err_set(err, -EPROTO, "REFUSED address malformed");
			break;
		case SBX_NET_REFUSAL_DROPPED:
			if (out->port != 0 || out->count == 0 ||
			    out->count > SBX_NET_REFUSAL_COUNT_MAX || out->len != 0)
				return sbx_err_set(err, -EPROTO, "REFUSED dropped count malformed");
			break;
		default:
			return sbx_err_set(err, -EPROTO, "REFUSED what %u unknown", out->value);
		}
		return finished(&c, err);
	case SBX_NET_MSG_DATA:
		if (f->payload_len == 0)
			return sbx_err_set(err, -EPROTO, "empty DATA");
		if (f->payload_len > SBX_NET_DATA_MAX)
			return sbx_err_set(err, -EMSGSIZE, "DATA of %u bytes over %u", f->payload_len,
					   SBX_NET_DATA_MAX);
		out->data = f->payload;
		out->len = f->payload_len;
		return 0;
	case SBX_NET_MSG_CREDIT:
		if ((rc = get_u32(&c, &out->value, "CREDIT", err)) < 0)
			return rc;
		if (out->value == 0 || out->value > SBX_NET_WINDOW)
			return sbx_err_set(err, -EPROTO, "CREDIT of %u bytes out of 1..%u", out->value,
					   SBX_NET_WINDOW);
		return finished(&c, err);
	case SBX_NET_MSG_SHUTDOWN:
		return finished(&c, err);
	case SBX_NET_MSG_CLOSE:
		if ((rc = get_u32(&c, &out->value, "CLOSE code", err)) < 0)
			return rc;
		if (out->value > SBX_NET_CLOSE_RESET)
			return sbx_err_set(err, -EPROTO, "CLOSE code %u unknown", out->value);
		return finished(&c, err);
	default:
		return sbx_err_set(err, -EPROTO, "not a guest -> host type");
	}
}
