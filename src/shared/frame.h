/* Frame codec for the wire format of protocol.h, shared by host and guest.
 *
 * Error convention (the whole C code base): functions return 0 (or a count) on success and a
 * negative errno on failure; they never print and never abort. -EPROTO means the peer sent bytes
 * that break the protocol, -EMSGSIZE that a length is over its hard limit, -ENOMEM allocation.
 */
#ifndef SBX_FRAME_H
#define SBX_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

/* A growable byte buffer. Zero-initialise; release with sbx_buf_free. */
struct sbx_buf {
	uint8_t *data;
	size_t len;
	size_t cap;
};

void sbx_buf_free(struct sbx_buf *b);
int sbx_buf_reserve(struct sbx_buf *b, size_t extra);
int sbx_buf_append(struct sbx_buf *b, const void *data, size_t n);
/* Drop the first n bytes (n <= len). */
void sbx_buf_consume(struct sbx_buf *b, size_t n);

/* Encoding: sbx_frame_begin reserves the header; put_* append payload fields; sbx_frame_end fills
 * in the length. A frame whose payload exceeds max_payload fails with -EMSGSIZE and is removed. */
int sbx_frame_begin(struct sbx_buf *b, uint8_t type, uint32_t id, size_t *frame_start);
int sbx_frame_end(struct sbx_buf *b, size_t frame_start, uint32_t max_payload);
int sbx_put_u8(struct sbx_buf *b, uint8_t v);
int sbx_put_u32(struct sbx_buf *b, uint32_t v);
int sbx_put_u64(struct sbx_buf *b, uint64_t v);
int sbx_put_str(struct sbx_buf *b, const void *data, size_t n); /* u32 length + bytes */

/* A decoded frame header; payload points into the reader's buffer and is valid until the next
 * call on that reader. */
struct sbx_frame {
	uint8_t type;
	uint32_t id;
	const uint8_t *payload;
	uint32_t payload_len;
};

/* Incremental decoder for a byte stream. Feed it whatever read() returned; take frames out with
 * sbx_reader_next. A protocol violation is sticky: once -EPROTO/-EMSGSIZE, always that. */
struct sbx_reader {
	struct sbx_buf buf;
	size_t consumed; /* bytes of buf already handed out as frames */
	uint32_t max_payload;
	int error;
};

void sbx_reader_init(struct sbx_reader *r, uint32_t max_payload);
void sbx_reader_free(struct sbx_reader *r);
/* Buffer incoming bytes. Fails with -EMSGSIZE if more than one maximal frame would be pending. */
int sbx_reader_feed(struct sbx_reader *r, const void *data, size_t n);
/* 1: *f holds a frame; 0: need more bytes; <0: the stream is broken. */
int sbx_reader_next(struct sbx_reader *r, struct sbx_frame *f);
/* Feeding without the copy of sbx_reader_feed: *at gets room for n bytes to read() into directly,
 * then sbx_reader_commit says how many arrived (<= n). The same limit as sbx_reader_feed applies
 * (-EMSGSIZE). Frames already taken out move only when the room runs out, not at every call. */
int sbx_reader_space(struct sbx_reader *r, size_t n, uint8_t **at);
void sbx_reader_commit(struct sbx_reader *r, size_t n);

/* Bounds-checked payload reader. Every get fails with -EPROTO past the end. */
struct sbx_cursor {
	const uint8_t *p;
	size_t left;
};

int sbx_get_u8(struct sbx_cursor *c, uint8_t *v);
int sbx_get_u32(struct sbx_cursor *c, uint32_t *v);
int sbx_get_u64(struct sbx_cursor *c, uint64_t *v);
/* A (u32 length, bytes) string of at most max bytes; *data points into the payload. */
int sbx_get_str(struct sbx_cursor *c, uint32_t max, const uint8_t **data, uint32_t *n);

/* Decoded EXIT payload. */
struct sbx_exit {
	int32_t exit_code;
	uint32_t flags;
	uint64_t duration_us;
};
int sbx_decode_exit(const struct sbx_frame *f, struct sbx_exit *out);
int sbx_encode_exit(struct sbx_buf *b, uint32_t id, const struct sbx_exit *e);

#endif /* SBX_FRAME_H */
