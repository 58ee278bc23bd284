/* Frame codec: see frame.h. Every length read from the wire is checked against what remains and
 * against a hard limit before it is used; nothing here trusts the peer. */
#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void store_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void sbx_buf_free(struct sbx_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

int sbx_buf_reserve(struct sbx_buf *b, size_t extra)
{
	if (extra > SIZE_MAX / 2 - b->len)
		return -ENOMEM;
	size_t need = b->len + extra;
	if (need <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap *= 2;
	uint8_t *p = realloc(b->data, cap);
	if (!p)
		return -ENOMEM;
	b->data = p;
	b->cap = cap;
	return 0;
}

int sbx_buf_append(struct sbx_buf *b, const void *data, size_t n)
{
	if (n == 0)
		return 0;
	int rc = sbx_buf_reserve(b, n);
	if (rc < 0)
		return rc;
	memcpy(b->data + b->len, data, n);
	b->len += n;
	return 0;
}

void sbx_buf_consume(struct sbx_buf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
		return;
	}
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
}

int sbx_frame_begin(struct sbx_buf *b, uint8_t type, uint32_t id, size_t *frame_start)
{
	uint8_t hdr[SBX_FRAME_HEADER_SIZE] = {0};
	hdr[4] = type;
	store_le32(hdr + 8, id);
	*frame_start = b->len;
	return sbx_buf_append(b, hdr, sizeof(hdr));
}

int sbx_frame_end(struct sbx_buf *b, size_t frame_start, uint32_t max_payload)
{
	size_t payload = b->len - frame_start - SBX_FRAME_HEADER_SIZE;
	if (payload > max_payload) {
		b->len = frame_start;
		return -EMSGSIZE;
	}
	store_le32(b->data + frame_start, (uint32_t)payload);
	return 0;
}

int sbx_put_u8(struct sbx_buf *b, uint8_t v)
{
	return sbx_buf_append(b, &v, 1);
}

int sbx_put_u32(struct sbx_buf *b, uint32_t v)
{
	uint8_t p[4];
	store_le32(p, v);
	return sbx_buf_append(b, p, 4);
}

int sbx_put_u64(struct sbx_buf *b, uint64_t v)
{
	int rc = sbx_put_u32(b, (uint32_t)v);
	return rc < 0 ? rc : sbx_put_u32(b, (uint32_t)(v >> 32));
}

int sbx_put_str(struct sbx_buf *b, const void *data, size_t n)
{
	if (n > UINT32_MAX)
		return -EMSGSIZE;
	int rc = sbx_put_u32(b, (uint32_t)n);
	return rc < 0 ? rc : sbx_buf_append(b, data, n);
}

void sbx_reader_init(struct sbx_reader *r, uint32_t max_payload)
{
	memset(r, 0, sizeof(*r));
	r->max_payload = max_payload;
}

void sbx_reader_free(struct sbx_reader *r)
{
	sbx_buf_free(&r->buf);
	r->consumed = 0;
}

int sbx_reader_feed(struct sbx_reader *r, const void *data, size_t n)
{
	if (r->error)
		return r->error;
	/* Frames handed out earlier are no longer referenced: compact before growing. */
	if (r->consumed) {
		sbx_buf_consume(&r->buf, r->consumed);
		r->consumed = 0;
	}
	size_t limit = (size_t)r->max_payload + SBX_FRAME_HEADER_SIZE;
	if (n > limit || r->buf.len > 2 * limit - n)
		return r->error = -EMSGSIZE;
	return sbx_buf_append(&r->buf, data, n);
}

int sbx_reader_space(struct sbx_reader *r, size_t n, uint8_t **at)
{
	if (r->error)
		return r->error;
	if (r->consumed && r->buf.cap - r->buf.len < n) {
		sbx_buf_consume(&r->buf, r->consumed);
		r->consumed = 0;
	}
	size_t limit = (size_t)r->max_payload + SBX_FRAME_HEADER_SIZE;
	if (n > limit || r->buf.len - r->consumed > 2 * limit - n)
		return r->error = -EMSGSIZE;
	int rc = sbx_buf_reserve(&r->buf, n);
	if (rc < 0)
		return rc;
	*at = r->buf.data + r->buf.len;
	return 0;
}

void sbx_reader_commit(struct sbx_reader *r, size_t n)
{
	r->buf.len += n;
}

int sbx_reader_next(struct sbx_reader *r, struct sbx_frame *f)
{
	if (r->error)
		return r->error;
	size_t avail = r->buf.len - r->consumed;
	if (avail < SBX_FRAME_HEADER_SIZE)
		return 0;
	const uint8_t *h = r->buf.data + r->consumed;
	uint32_t len = load_le32(h);
	if (h[5] != 0 || h[6] != 0 || h[7] != 0)
		return r->error = -EPROTO;
	if (len > r->max_payload)
		return r->error = -EMSGSIZE;
	if (avail - SBX_FRAME_HEADER_SIZE < len)
		return 0;
	f->type = h[4];
	f->id = load_le32(h + 8);
	f->payload = h + SBX_FRAME_HEADER_SIZE;
	f->payload_len = len;
	r->consumed += SBX_FRAME_HEADER_SIZE + len;
	return 1;
}

int sbx_get_u8(struct sbx_cursor *c, uint8_t *v)
{
	if (c->left < 1)
		return -EPROTO;
	*v = c->p[0];
	c->p++;
	c->left--;
	return 0;
}

int sbx_get_u32(struct sbx_cursor *c, uint32_t *v)
{
	if (c->left < 4)
		return -EPROTO;
	*v = load_le32(c->p);
	c->p += 4;
	c->left -= 4;
	return 0;
}

int sbx_get_u64(struct sbx_cursor *c, uint64_t *v)
{
	uint32_t lo, hi;
	if (sbx_get_u32(c, &lo) < 0 || sbx_get_u32(c, &hi) < 0)
		return -EPROTO;
	*v = (uint64_t)hi << 32 | lo;
	return 0;
}

int sbx_get_str(struct sbx_cursor *c, uint32_t max, const uint8_t **data, uint32_t *n)
{
	uint32_t len;
	if (sbx_get_u32(c, &len) < 0)
		return -EPROTO;
	if (len > max)
		return -EMSGSIZE;
	if (len > c->left)
		return -EPROTO;
	*data = c->p;
	*n = len;
	c->p += len;
	c->left -= len;
	return 0;
}

int sbx_decode_exit(const struct sbx_frame *f, struct sbx_exit *out)
{
	struct sbx_cursor c = {f->payload, f->payload_len};
	uint32_t code;
	if (f->type != SBX_MSG_EXIT || f->payload_len != SBX_EXIT_PAYLOAD_SIZE)
		return -EPROTO;
	if (sbx_get_u32(&c, &code) < 0 || sbx_get_u32(&c, &out->flags) < 0 ||
	    sbx_get_u64(&c, &out->duration_us) < 0)
		return -EPROTO;
	if (out->flags & ~(uint32_t)SBX_EXIT_FLAGS_ALL)
		return -EPROTO;
	out->exit_code = (int32_t)code;
	/* A status outside what a process can report is a lie: 0..255, 128+signal, or -1. */
	if (out->exit_code < -1 || out->exit_code > 255)
		return -EPROTO;
	return 0;
}

int sbx_encode_exit(struct sbx_buf *b, uint32_t id, const struct sbx_exit *e)
{
	size_t start;
	int rc = sbx_frame_begin(b, SBX_MSG_EXIT, id, &start);
	if (rc == 0)
		rc = sbx_put_u32(b, (uint32_t)e->exit_code);
	if (rc == 0)
		rc = sbx_put_u32(b, e->flags);
	if (rc == 0)
		rc = sbx_put_u64(b, e->duration_us);
	if (rc == 0)
		rc = sbx_frame_end(b, start, SBX_GUEST_FRAME_MAX);
	return rc;
}
