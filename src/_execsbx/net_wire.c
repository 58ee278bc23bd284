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

/* The payload must have been read whole. */
static int finished(const struct sbx_cursor *c)
{
	return c->left == 0 ? 0 : -EPROTO;
}

int sbx_net_decode(const struct sbx_frame *f, struct sbx_net_frame *out)
{
	struct sbx_cursor c = {f->payload, f->payload_len};
	int err;

	memset(out, 0, sizeof(*out));
	out->type = f->type;
	out->stream = f->id;
	if (f->id == 0)
		return -EPROTO;
	if (f->payload_len > SBX_NET_FRAME_MAX)
		return -EMSGSIZE;
	switch (f->type) {
	case SBX_NET_MSG_OPEN:
		if (f->id & HOST_STREAM_BIT)
			return -EPROTO;
		if ((err = sbx_get_u32(&c, &out->value)) < 0)
			return err;
		if (out->value == 0 || out->value > 65535)
			return -EPROTO;
		if ((err = sbx_get_str(&c, SBX_NET_NAME_MAX, &out->data, &out->len)) < 0)
			return err;
		if (!sbx_net_name_ok(out->data, out->len))
			return -EPROTO;
		return finished(&c);
	case SBX_NET_MSG_CONNECTED:
		if (!(f->id & HOST_STREAM_BIT))
			return -EPROTO;
		if ((err = sbx_get_u32(&c, &out->value)) < 0)
			return err;
		if (out->value > SBX_NET_STATUS_MAX)
			return -EPROTO;
		return finished(&c);
	case SBX_NET_MSG_DATA:
		if (f->payload_len == 0)
			return -EPROTO;
		if (f->payload_len > SBX_NET_DATA_MAX)
			return -EMSGSIZE;
		out->data = f->payload;
		out->len = f->payload_len;
		return 0;
	case SBX_NET_MSG_CREDIT:
		if ((err = sbx_get_u32(&c, &out->value)) < 0)
			return err;
		if (out->value == 0 || out->value > SBX_NET_WINDOW)
			return -EPROTO;
		return finished(&c);
	case SBX_NET_MSG_SHUTDOWN:
		return finished(&c);
	case SBX_NET_MSG_CLOSE:
		if ((err = sbx_get_u32(&c, &out->value)) < 0)
			return err;
		if (out->value > SBX_NET_CLOSE_RESET)
			return -EPROTO;
		return finished(&c);
	default:
		return -EPROTO;
	}
}
