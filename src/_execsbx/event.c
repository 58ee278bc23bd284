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

int sbx_dir_entry_next(struct sbx_cursor *c, struct sbx_dir_entry *e)
{
	int rc;
	if ((rc = sbx_get_u8(c, &e->is_dir)) < 0 || (rc = sbx_get_u64(c, &e->size)) < 0 ||
	    (rc = sbx_get_str(c, SBX_PATH_COMPONENT_MAX, &e->name, &e->name_len)) < 0)
		return rc;
	if (e->is_dir > 1 || e->name_len == 0 || memchr(e->name, '/', e->name_len) ||
	    memchr(e->name, '\0', e->name_len))
		return -EPROTO;
	if ((e->name_len == 1 && e->name[0] == '.') ||
	    (e->name_len == 2 && e->name[0] == '.' && e->name[1] == '.'))
		return -EPROTO;
	return 0;
}

static int decode_entries(struct sbx_cursor *c, struct sbx_event *ev)
{
	int rc = sbx_get_u32(c, &ev->count);
	if (rc < 0)
		return rc;
	if (ev->count < 1 || ev->count > SBX_LIST_BATCH_MAX)
		return -EPROTO;
	ev->data = c->p;
	for (uint32_t i = 0; i < ev->count; i++) {
		struct sbx_dir_entry e;
		if ((rc = sbx_dir_entry_next(c, &e)) < 0)
			return rc;
	}
	ev->len = (uint32_t)(c->p - ev->data);
	return 0;
}

static int decode_file_error(struct sbx_cursor *c, struct sbx_event *ev)
{
	int rc = sbx_get_u32(c, &ev->error_code);
	if (rc < 0)
		return rc;
	if (ev->error_code < SBX_FILE_ERR_PATH || ev->error_code > SBX_FILE_ERR_MAX)
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
		break;
	case SBX_MSG_FILE_DATA:
		if (f->payload_len < 1 || f->payload_len > SBX_FILE_CHUNK_MAX)
			return -EPROTO;
		ev->data = f->payload;
		ev->len = f->payload_len;
		c.left = 0;
		break;
	case SBX_MSG_FILE_ENTRIES:
		rc = decode_entries(&c, ev);
		break;
	case SBX_MSG_FILE_DONE:
		rc = sbx_get_u64(&c, &ev->value);
		break;
	case SBX_MSG_FILE_ERROR:
		rc = decode_file_error(&c, ev);
		break;
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
	case SBX_EV_FILE_DATA:
		return "file_data";
	case SBX_EV_FILE_ENTRIES:
		return "file_entries";
	case SBX_EV_FILE_DONE:
		return "file_done";
	case SBX_EV_FILE_ERROR:
		return "file_error";
	}
	return "?";
}
