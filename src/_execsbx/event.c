/* Payload validation of guest -> host frames. The guest is the attacker: every field is checked,
 * trailing bytes are an error, and nothing is allocated. */
#include "event.h"

#include <errno.h>
#include <string.h>

static int decode_ready(struct sbx_cursor *c, struct sbx_event *ev)
{
	int rc = sbx_get_u32(c, &ev->protocol_version);
	if (rc < 0)
		return rc;
	return sbx_get_str(c, SBX_AGENT_VERSION_MAX, &ev->data, &ev->len);
}

static int decode_error(struct sbx_cursor *c, struct sbx_event *ev)
{
	int rc = sbx_get_u32(c, &ev->error_code);
	if (rc < 0)
		return rc;
	if (ev->error_code < SBX_ERR_BAD_REQUEST || ev->error_code > SBX_ERR_INTERNAL)
		return -EPROTO;
	return sbx_get_str(c, SBX_ERROR_MESSAGE_MAX, &ev->data, &ev->len);
}

int sbx_event_decode(const struct sbx_frame *f, struct sbx_event *ev)
{
	struct sbx_cursor c = {f->payload, f->payload_len};
	int rc = 0;

	memset(ev, 0, sizeof(*ev));
	ev->id = f->id;
	switch (f->type) {
	case SBX_MSG_READY:
		rc = decode_ready(&c, ev);
		break;
	case SBX_MSG_STDOUT:
	case SBX_MSG_STDERR:
		if (f->payload_len < 1 || f->payload_len > SBX_OUTPUT_CHUNK_MAX)
			return -EPROTO;
		ev->data = f->payload;
		ev->len = f->payload_len;
		c.left = 0;
		break;
	case SBX_MSG_EXIT:
		rc = sbx_decode_exit(f, &ev->exit);
		c.left = 0;
		break;
	case SBX_MSG_ERROR:
		rc = decode_error(&c, ev);
		break;
	case SBX_MSG_PONG:
	case SBX_MSG_RESEEDED:
		break; /* empty: c.left must be 0 */
	default:
		/* Unknown, or a host -> guest type. */
		return -EPROTO;
	}
	if (rc < 0)
		return rc;
	if (c.left != 0)
		return -EPROTO;
	ev->kind = (enum sbx_event_kind)f->type;
	return 0;
}

const char *sbx_event_kind_name(enum sbx_event_kind kind)
{
	switch (kind) {
	case SBX_EV_READY:
		return "ready";
	case SBX_EV_STDOUT:
		return "stdout";
	case SBX_EV_STDERR:
		return "stderr";
	case SBX_EV_EXIT:
		return "exit";
	case SBX_EV_ERROR:
		return "error";
	case SBX_EV_PONG:
		return "pong";
	case SBX_EV_RESEEDED:
		return "reseeded";
	}
	return "?";
}
