/* Host requests: see dispatch.h. Every request gets an answer with its id: PONG, an ERROR, or (for
 * EXEC) output frames ending in EXIT. The framing is intact here (the reader checked it), so a bad
 * payload is answered with BAD_REQUEST and the stream goes on. */
#include "dispatch.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "agent_request_guest.h"
#include "cleanup.h"
#include "reseed.h"
#include "template.h"

static void handle_exec(struct sbx_agent *a, const struct sbx_frame *f)
{
	bool session = f->type == SBX_MSG_SESSION_EXEC;
	/* Points into the frame: used up before the reader is called again. */
	struct sbx_exec_request req;
	const char *why = NULL;
	int rc = sbx_parse_exec(f->payload, f->payload_len, &req, &why);
	if (rc < 0) {
		sbx_channel_send_error(&a->ch, f->id, SBX_ERR_BAD_REQUEST, "bad EXEC: %s", why);
		return;
	}
	uint32_t code = 0;
	char msg[512];
	/* A VM serves one-shot runs or one session, never both at once. */
	if (sbx_runner_busy(&a->runner) || sbx_repl_busy(&a->repl)) {
		sbx_channel_send_error(&a->ch, f->id, SBX_ERR_BUSY, "an execution is already running");
		return;
	}
	if (!sbx_mode_allows(&a->cfg, req.language, session, &code, msg, sizeof(msg))) {
		sbx_channel_send_error(&a->ch, f->id, code, "%s", msg);
		return;
	}
	if (session) {
		/* A waiting node becomes the session's REPL driver: its start, the dear part of a
		 * javascript session's, is then already paid (an L1 template holds one). */
		char driver[300];
		int control_fd = -1;
		pid_t pid = 0;
		if (a->repl.pid == 0 &&
		    sbx_repl_driver_path(&a->repl, req.language, driver, sizeof(driver)))
			pid = sbx_runner_hand_over(&a->runner, req.language, driver, &control_fd);
		if (pid > 0)
			sbx_repl_adopt(&a->repl, req.language, pid, control_fd);
		/* Any other: a session's code must not find a waiting uid-1000 interpreter it could
		 * feed. */
		sbx_runner_discard_prestarted(&a->runner);
		rc = sbx_repl_start(&a->repl, f->id, &req, &code, msg, sizeof(msg));
	} else {
		rc = sbx_runner_start(&a->runner, f->id, &req, &code, msg, sizeof(msg));
	}
	if (rc < 0) {
		if (code != SBX_ERR_BUSY)
			sbx_log("EXEC %u failed to start: %s", f->id, msg);
		sbx_channel_send_error(&a->ch, f->id, code, "%s", msg);
	}
}

static void handle_prestart(struct sbx_agent *a, const struct sbx_frame *f)
{
	uint8_t language = 0;
	const char *why = NULL;
	if (sbx_parse_prestart(f->payload, f->payload_len, &language, &why) < 0) {
		sbx_channel_send_error(&a->ch, f->id, SBX_ERR_BAD_REQUEST, "bad PRESTART: %s", why);
		return;
	}
	uint32_t code = 0;
	char msg[512];
	if (!sbx_mode_allows(&a->cfg, language, true, &code, msg, sizeof(msg))) {
		sbx_channel_send_error(&a->ch, f->id, code, "PRESTART: %s", msg);
		return;
	}
	if (sbx_repl_busy(&a->repl) ||
	    sbx_runner_prestart(&a->runner, language, &code, msg, sizeof(msg)) < 0) {
		if (sbx_repl_busy(&a->repl)) {
			code = SBX_ERR_BUSY;
			snprintf(msg, sizeof(msg), "an execution is already running");
		}
		sbx_channel_send_error(&a->ch, f->id, code, "PRESTART: %s", msg);
		return;
	}
	sbx_channel_send(&a->ch, SBX_MSG_PONG, f->id, NULL, 0);
}

/* NET_CONFIG: answered PONG once the net port, the DNS stub and the CA bundle are in place, so
 * that the host starts user code only after that. */
static void handle_net_config(struct sbx_agent *a, const struct sbx_frame *f)
{
	char msg[256];
	int rc = sbx_net_configure(&a->net, f->payload, f->payload_len, a->net_test_fd,
				   a->cfg.test_mode, a->cfg.boot, msg, sizeof(msg));
	if (rc == 0) {
		sbx_close_fd(&a->net_test_fd); /* the net module has its own copy */
		/* node reads NODE_EXTRA_CA_CERTS once, at its start: a node started before this
		 * NET_CONFIG (PRESTART) would never trust the bundle it brought. Python, curl & co.
		 * open their bundle when they first need it. */
		if (a->net.cfg.ca_bundle && a->runner.pre.pid > 0 &&
		    a->runner.pre.language == SBX_LANG_JAVASCRIPT)
			sbx_runner_discard_prestarted(&a->runner);
		sbx_channel_send(&a->ch, SBX_MSG_PONG, f->id, NULL, 0);
		return;
	}
	sbx_log("%s", msg);
	sbx_channel_send_error(&a->ch, f->id,
			       rc == -EPROTO || rc == -EMSGSIZE || rc == -EALREADY || rc == -EPERM
				       ? SBX_ERR_BAD_REQUEST
				       : SBX_ERR_INTERNAL,
			       "%s", msg);
}

void sbx_dispatch_frame(void *ctx, const struct sbx_frame *f)
{
	struct sbx_agent *a = ctx;
	switch (f->type) {
	case SBX_MSG_PING:
		if (f->payload_len != 0)
			sbx_channel_send_error(&a->ch, f->id, SBX_ERR_BAD_REQUEST,
					       "PING carries no payload");
		else
			sbx_channel_send(&a->ch, SBX_MSG_PONG, f->id, NULL, 0);
		break;
	case SBX_MSG_EXEC:
	case SBX_MSG_SESSION_EXEC:
		handle_exec(a, f);
		break;
	case SBX_MSG_RESEED: {
		const char *why = "?";
		int rc = sbx_handle_reseed(f->payload, f->payload_len, &why);
		if (rc < 0)
			sbx_channel_send_error(&a->ch, f->id, rc == -EINVAL ? SBX_ERR_BAD_REQUEST
									  : SBX_ERR_INTERNAL,
					       "RESEED: %s: %s", why, strerror(-rc));
		else {
			/* Before the answer: the host may send the EXEC that gives the go next. */
			sbx_runner_note_reseed(&a->runner);
			sbx_channel_send(&a->ch, SBX_MSG_RESEEDED, f->id, NULL, 0);
		}
		break;
	}
	case SBX_MSG_PRESTART:
		handle_prestart(a, f);
		break;
	case SBX_MSG_FILE_WRITE_BEGIN:
	case SBX_MSG_FILE_WRITE_DATA:
	case SBX_MSG_FILE_WRITE_END:
	case SBX_MSG_FILE_READ:
	case SBX_MSG_FILE_LIST:
		sbx_files_handle(&a->files, f);
		break;
	case SBX_MSG_NET_CONFIG:
		handle_net_config(a, f);
		break;
	case SBX_MSG_PROC_SPAWN:
	case SBX_MSG_PROC_READ:
	case SBX_MSG_PROC_WRITE:
	case SBX_MSG_PROC_SIGNAL:
	case SBX_MSG_PROC_WAIT:
	case SBX_MSG_PROC_LIST:
	case SBX_MSG_PROC_RESIZE:
		sbx_procs_handle(&a->procs, f);
		break;
	case SBX_MSG_TOOL_RESULT:
		/* Never answered on the channel: its id is the execution's (host_socket.h). */
		sbx_host_socket_on_tool_result(&a->hs, f);
		break;
	default:
		sbx_channel_send_error(&a->ch, f->id, SBX_ERR_BAD_REQUEST,
				       "unexpected message type %u", f->type);
		break;
	}
}
