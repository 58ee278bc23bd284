/* The host end of the agent channel: a non-blocking stream socket carrying frames both ways.
 * Incoming bytes go through an sbx_reader capped at SBX_GUEST_FRAME_MAX and are validated into
 * events (event.h); a decoding error is sticky. Outgoing frames queue in a buffer that flush
 * writes as far as the socket accepts. Never blocks; never calls into Python. */
#ifndef SBX_CHANNEL_H
#define SBX_CHANNEL_H

#include <stddef.h>
#include <sys/types.h>

#include "event.h"
#include "frame.h"
#include "agent_request.h"

/* Queued outgoing bytes beyond which queueing fails with -ENOBUFS (the guest is not reading). */
#define SBX_CHANNEL_OUT_MAX (8u * 1024u * 1024u)
/* One read() takes at most one maximal guest frame, so the reader never holds more than two. */
#define SBX_CHANNEL_READ_CHUNK (SBX_GUEST_FRAME_MAX + SBX_FRAME_HEADER_SIZE)

struct sbx_channel {
	int fd; /* owned; -1 once closed */
	int eof; /* the peer closed its end */
	int error; /* sticky: -EPROTO / -EMSGSIZE once the guest broke the protocol */
	int error_frame_type; /* the type of the frame whose payload was bad; -1: header/stream */
	struct sbx_reader in;
	struct sbx_buf out;
	size_t out_off; /* bytes of out already written */
	uint8_t scratch[SBX_CHANNEL_READ_CHUNK];
};

/* Take ownership of fd (may be -1 for a channel only fed through sbx_channel_ingest). */
void sbx_channel_init(struct sbx_channel *ch, int fd);
/* Close the fd (if any) and free the buffers. Idempotent. */
void sbx_channel_destroy(struct sbx_channel *ch);
/* Detach the fd without closing it (returns it; ch->fd becomes -1). */
int sbx_channel_take_fd(struct sbx_channel *ch);

/* One non-blocking read of at most min(max, SBX_CHANNEL_READ_CHUNK) bytes, fed to the decoder.
 * Returns the byte count (> 0), 0 when nothing is available now or the peer closed (then
 * ch->eof is set; ECONNRESET counts as closed), or -errno with err filled (the sticky protocol
 * error, -ENOMEM, or recv's). Drain every event with sbx_channel_next_event before reading
 * again. */
ssize_t sbx_channel_read(struct sbx_channel *ch, size_t max, struct sbx_err *err);
/* Feed bytes that came from elsewhere (tests, fuzzer). 0 or the sticky error / -ENOMEM. */
int sbx_channel_ingest(struct sbx_channel *ch, const void *data, size_t n);
/* 1: *ev holds the next event (pointers valid until the next read/ingest); 0: no complete
 * frame; <0: the guest broke the protocol (sticky: every later call returns it too). */
int sbx_channel_next_event(struct sbx_channel *ch, struct sbx_event *ev);

/* Queue a frame, then try to write. 0, or -errno with e filled: -EINVAL/-EMSGSIZE (a bad
 * request), -ENOBUFS (queue full), -ENOMEM, or a write error (-EPIPE ...; the frame stays
 * queued). */
int sbx_channel_queue_exec(struct sbx_channel *ch, const struct sbx_exec_req *r, struct sbx_err *e);
int sbx_channel_queue_ping(struct sbx_channel *ch, uint32_t id, struct sbx_err *e);
/* n must be SBX_RESEED_BYTES. */
int sbx_channel_queue_reseed(struct sbx_channel *ch, uint32_t id, const uint8_t *seed, size_t n,
			     uint64_t realtime_ns, struct sbx_err *e);
int sbx_channel_queue_prestart(struct sbx_channel *ch, uint32_t id, uint8_t language,
			       struct sbx_err *e);
int sbx_channel_queue_file(struct sbx_channel *ch, const struct sbx_file_req *r, struct sbx_err *e);
int sbx_channel_queue_net_config(struct sbx_channel *ch, const struct sbx_net_config_req *r,
				 struct sbx_err *e);
int sbx_channel_queue_tool_result(struct sbx_channel *ch, const struct sbx_tool_result_req *r,
				  struct sbx_err *e);
int sbx_channel_queue_proc(struct sbx_channel *ch, const struct sbx_proc_req *r, struct sbx_err *e);
/* Write as much of the queue as the socket takes now. 0 or -errno with e filled (EAGAIN is not
 * an error). */
int sbx_channel_flush(struct sbx_channel *ch, struct sbx_err *e);
/* The sticky protocol error, explained (-EPROTO/-EMSGSIZE and what the guest got wrong); err
 * cleared when there is none. */
void sbx_channel_error(const struct sbx_channel *ch, struct sbx_err *err);
/* Bytes queued and not yet written. */
size_t sbx_channel_pending(const struct sbx_channel *ch);

#endif /* SBX_CHANNEL_H */
