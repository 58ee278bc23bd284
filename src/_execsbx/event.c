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
	if (ev->error_code < SBX_ERR_BAD_REQUEST || ev->error_code > SBX_ERR_MAX)
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

/* The host looks a tool up by this name and shows it in messages: an identifier, nothing that
 * could pass for a path, a format or another line. */
static int tool_name_ok(const uint8_t *s, uint32_t n)
{
	if (n == 0)
		return 0;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		int alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
		if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
			return 0;
	}
	return 1;
}

/* type/subtype: one '/', neither side empty, lowercase [a-z0-9.+_-] otherwise. The host hands it
 * to whoever renders the output, so nothing beyond that narrow set gets through (no parameters,
 * no spaces, no control bytes). */
static int mime_type_ok(const uint8_t *s, uint32_t n)
{
	uint32_t slash = n;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		if (c == '/') {
			if (slash != n)
				return 0;
			slash = i;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '+' ||
		      c == '_' || c == '-'))
			return 0;
	}
	return slash > 0 && slash + 1 < n; /* slash == n: none at all */
}

static int decode_tool_call(struct sbx_cursor *c, struct sbx_event *ev)
{
	int rc;
	if ((rc = sbx_get_u32(c, &ev->call)) < 0 ||
	    (rc = sbx_get_str(c, SBX_TOOL_NAME_MAX, &ev->name, &ev->name_len)) < 0 ||
	    (rc = sbx_get_str(c, SBX_TOOL_ARGS_MAX, &ev->data, &ev->len)) < 0)
		return rc;
	/* Call 0 is no call: the host keys its reply by the number. The arguments are JSON text,
	 * which is never empty; the host parses them, not this decoder. */
	if (ev->call == 0 || !tool_name_ok(ev->name, ev->name_len) || ev->len == 0)
		return -EPROTO;
	return 0;
}

static int decode_output(struct sbx_cursor *c, struct sbx_event *ev)
{
	uint8_t flags;
	int rc = sbx_get_u8(c, &flags);
	if (rc < 0)
		return rc;
	if (flags & ~(unsigned)(SBX_OUTPUT_BEGIN | SBX_OUTPUT_END))
		return -EPROTO;
	ev->flags = flags;
	if (flags & SBX_OUTPUT_BEGIN) {
		rc = sbx_get_str(c, SBX_MIME_TYPE_MAX, &ev->name, &ev->name_len);
		if (rc < 0)
			return rc;
		if (!mime_type_ok(ev->name, ev->name_len))
			return -EPROTO;
	}
	/* The rest is data; empty is fine (an empty output, or an END after a full chunk). */
	if (c->left > SBX_OUTPUT_DATA_MAX)
		return -EPROTO;
	ev->data = c->p;
	ev->len = (uint32_t)c->left;
	c->left = 0;
	return 0;
}

int sbx_proc_entry_next(struct sbx_cursor *c, struct sbx_proc_entry *e)
{
	uint32_t code;
	int rc;
	if ((rc = sbx_get_u32(c, &e->pid)) < 0 || (rc = sbx_get_u8(c, &e->flags)) < 0 ||
	    (rc = sbx_get_u32(c, &code)) < 0 || (rc = sbx_get_u64(c, &e->stdout_bytes)) < 0 ||
	    (rc = sbx_get_u64(c, &e->stderr_bytes)) < 0 ||
	    (rc = sbx_get_str(c, SBX_PROC_COMMAND_MAX, &e->command, &e->command_len)) < 0)
		return rc;
	e->exit_code = (int32_t)code;
	/* The host keys handles by pid and hands the status to callers as an exit code: a pid 0,
	 * an unknown flag, a status EXIT could not carry or one while running is a lie. */
	if (e->pid == 0 || (e->flags & ~(unsigned)SBX_PROC_FLAGS_ALL) || e->exit_code < 0 ||
	    e->exit_code > 255 || ((e->flags & SBX_PROC_RUNNING) && e->exit_code != 0))
		return -EPROTO;
	if (e->command_len && memchr(e->command, '\0', e->command_len))
		return -EPROTO;
	return 0;
}

static int decode_proc_info(struct sbx_cursor *c, struct sbx_event *ev)
{
	int rc = sbx_get_u32(c, &ev->count);
	if (rc < 0)
		return rc;
	if (ev->count > SBX_PROC_TRACKED_MAX)
		return -EPROTO;
	ev->data = c->p;
	for (uint32_t i = 0; i < ev->count; i++) {
		struct sbx_proc_entry e;
		if ((rc = sbx_proc_entry_next(c, &e)) < 0)
			return rc;
	}
	ev->len = (uint32_t)(c->p - ev->data);
	return 0;
}

static int decode_proc_data(struct sbx_cursor *c, struct sbx_event *ev)
{
	uint8_t flags;
	int rc;
	if ((rc = sbx_get_u64(c, &ev->value)) < 0 || (rc = sbx_get_u8(c, &flags)) < 0)
		return rc;
	if (flags & ~(unsigned)SBX_PROC_DATA_EOF)
		return -EPROTO;
	ev->flags = flags;
	/* The rest is the data (may be empty: the wait passed, or EOF). No more than one PROC_READ
	 * may ask for, and the stream's offsets must not wrap. */
	if (c->left > SBX_OUTPUT_CHUNK_MAX || ev->value > UINT64_MAX - c->left)
		return -EPROTO;
	ev->data = c->p;
	ev->len = (uint32_t)c->left;
	c->left = 0;
	return 0;
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
	case SBX_MSG_TOOL_CALL:
		rc = decode_tool_call(&c, ev);
		break;
	case SBX_MSG_OUTPUT:
		rc = decode_output(&c, ev);
		break;
	case SBX_MSG_PROC_INFO:
		rc = decode_proc_info(&c, ev);
		break;
	case SBX_MSG_PROC_DATA:
		rc = decode_proc_data(&c, ev);
		break;
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
	case SBX_EV_FILE_DATA:
		return "file_data";
	case SBX_EV_FILE_ENTRIES:
		return "file_entries";
	case SBX_EV_FILE_DONE:
		return "file_done";
	case SBX_EV_FILE_ERROR:
		return "file_error";
	case SBX_EV_RESEEDED:
		return "reseeded";
	case SBX_EV_TOOL_CALL:
		return "tool_call";
	case SBX_EV_OUTPUT:
		return "output";
	case SBX_EV_PROC_INFO:
		return "proc_info";
	case SBX_EV_PROC_DATA:
		return "proc_data";
	}
	return "?";
}
