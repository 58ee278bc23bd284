/* Output rings: see proc_ring.h. */
#include "proc_ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void sbx_ring_init(struct sbx_ring *r, size_t max)
{
	memset(r, 0, sizeof(*r));
	r->max = max < SBX_RING_MIN_CAP ? SBX_RING_MIN_CAP : max;
}

static size_t growth(size_t cap)
{
	return cap > SBX_RING_MIN_CAP ? cap - SBX_RING_MIN_CAP : 0;
}

void sbx_ring_free(struct sbx_ring *r, struct sbx_ring_budget *b)
{
	size_t g = growth(r->cap);
	b->used = b->used > g ? b->used - g : 0;
	free(r->data);
	r->data = NULL;
	r->cap = 0;
	r->head = 0;
	r->start = r->end;
}

static size_t held(const struct sbx_ring *r)
{
	return (size_t)(r->end - r->start);
}

/* Copy the held bytes, oldest first, into dst (room for held(r)). */
static void linearize(const struct sbx_ring *r, uint8_t *dst)
{
	size_t n = held(r);
	size_t first = r->cap - r->head < n ? r->cap - r->head : n;
	memcpy(dst, r->data + r->head, first);
	memcpy(dst + first, r->data, n - first);
}

/* Make room for `want` bytes if the limit and the budget allow (doubling, so that a stream
 * copies its bytes O(log) times); what cannot be had is simply not had. */
static void grow(struct sbx_ring *r, struct sbx_ring_budget *b, size_t want)
{
	if (want <= r->cap || r->cap >= r->max)
		return;
	size_t cap = r->cap ? r->cap : SBX_RING_MIN_CAP;
	while (cap < want && cap < r->max)
		cap *= 2;
	if (cap > r->max)
		cap = r->max;
	size_t extra = growth(cap) - growth(r->cap);
	size_t left = b->max > b->used ? b->max - b->used : 0;
	if (extra > left) {
		cap -= extra - left;
		extra = left;
	}
	if (cap <= r->cap)
		return;
	uint8_t *data = malloc(cap);
	if (!data)
		return;
	if (r->data)
		linearize(r, data);
	free(r->data);
	r->data = data;
	r->cap = cap;
	r->head = 0;
	b->used += extra;
}

void sbx_ring_write(struct sbx_ring *r, struct sbx_ring_budget *b, const uint8_t *data, size_t n)
{
	if (n == 0)
		return;
	grow(r, b, held(r) + n);
	if (r->cap == 0) {
		r->end += n;
		r->start = r->end;
		return;
	}
	if (n >= r->cap) {
		/* Only the last cap bytes survive. */
		memcpy(r->data, data + (n - r->cap), r->cap);
		r->end += n;
		r->start = r->end - r->cap;
		r->head = 0;
		return;
	}
	size_t room = r->cap - held(r);
	if (n > room) {
		size_t drop = n - room;
		r->start += drop;
		r->head = (r->head + drop) % r->cap;
	}
	size_t at = (r->head + held(r)) % r->cap;
	size_t first = r->cap - at < n ? r->cap - at : n;
	memcpy(r->data + at, data, first);
	memcpy(r->data, data + first, n - first);
	r->end += n;
}

long sbx_ring_read(const struct sbx_ring *r, uint64_t offset, uint8_t *out, size_t max,
		   uint64_t *from)
{
	if (offset > r->end)
		return -ERANGE;
	if (offset < r->start)
		offset = r->start;
	*from = offset;
	size_t n = (size_t)(r->end - offset);
	if (n > max)
		n = max;
	if (n == 0)
		return 0;
	size_t at = (r->head + (size_t)(offset - r->start)) % r->cap;
	size_t first = r->cap - at < n ? r->cap - at : n;
	memcpy(out, r->data + at, first);
	memcpy(out + first, r->data, n - first);
	return (long)n;
}
