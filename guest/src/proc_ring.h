/* A process's output stream kept for readers that pull (protocol.h, "Processes"): the stream's
 * last bytes, addressed by absolute offset (bytes the stream produced so far), in a ring that
 * starts small and grows up to SBX_PROC_BUFFER_MAX while a budget shared by all rings allows;
 * past that it drops its oldest bytes. Pure: no I/O, so the unit test and the fuzz target
 * (tests/c/test_proc_ring.c, fuzz_proc_ring.c) drive it directly. */
#ifndef SBX_PROC_RING_H
#define SBX_PROC_RING_H

#include <stddef.h>
#include <stdint.h>

/* Every ring gets this much at its first byte, outside the budget: the budget is for growth,
 * so a new process's output is kept even while others filled the budget. */
#define SBX_RING_MIN_CAP (4u * 1024u)

/* Bytes of growth past SBX_RING_MIN_CAP, summed over every ring that shares it. */
struct sbx_ring_budget {
	size_t used;
	size_t max;
};

struct sbx_ring {
	uint8_t *data;
	size_t cap;    /* 0 until the first byte */
	size_t max;    /* cap never grows past this */
	size_t head;   /* index in data of the byte at offset start */
	uint64_t start; /* offset of the oldest byte held */
	uint64_t end;   /* offset after the newest byte: bytes produced so far */
};

/* max: the ring's capacity limit (>= SBX_RING_MIN_CAP). */
void sbx_ring_init(struct sbx_ring *r, size_t max);
/* Frees the data and gives its growth back to the budget. */
void sbx_ring_free(struct sbx_ring *r, struct sbx_ring_budget *b);
/* Append n bytes, growing if the budget allows, else dropping the oldest ones (all but the last
 * cap bytes when n alone is more). Never fails: an allocation failure only means more is dropped
 * (with no room at all, every byte is; end still counts them). */
void sbx_ring_write(struct sbx_ring *r, struct sbx_ring_budget *b, const uint8_t *data, size_t n);
/* Copy up to max bytes from `offset` on (or from start, if offset is older) into out. Returns the
 * count and sets *from to the offset of the first byte copied; -ERANGE when offset > end. */
long sbx_ring_read(const struct sbx_ring *r, uint64_t offset, uint8_t *out, size_t max,
		   uint64_t *from);

#endif /* SBX_PROC_RING_H */
