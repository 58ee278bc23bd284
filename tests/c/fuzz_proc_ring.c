/* libFuzzer target for the agent's output rings (guest/src/proc_ring.c): writes and reads in any
 * order and size, two rings sharing a small budget, checked against a model that keeps every byte.
 * What must hold: a read returns exactly the stream's bytes from the offset it reports, never
 * before the one asked for unless those were dropped, never past the end; a ring holds at most
 * its capacity and its limit; the budget is never overdrawn and is whole again once both rings
 * are freed.
 *
 * Input: 1 byte ring limit (in KiB, 4..67), 1 byte budget (in KiB), then operations of 3 bytes:
 * op (bit 0: which ring; bit 1: read, else write; bit 2 with a write: free the ring first), and a
 * u16 size or offset back from the end. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../guest/src/proc_ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

/* Byte i of stream s: a pattern a misplaced byte cannot match by chance for long. */
static uint8_t byte_at(int s, uint64_t i)
{
	return (uint8_t)(i * 131u + i / 256u + (uint64_t)s * 17u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	size_t limit = ((size_t)(data[0] % 64) + 4) * 1024;
	struct sbx_ring_budget b = {0, (size_t)data[1] * 1024};
	data += 2;
	size -= 2;
	struct sbx_ring r[2];
	uint64_t freed_at[2] = {0, 0}; /* a freed ring keeps its end: nothing before is readable */
	sbx_ring_init(&r[0], limit);
	sbx_ring_init(&r[1], limit);
	static uint8_t buf[65536 + 1];
	for (size_t i = 0; i + 3 <= size; i += 3) {
		int s = data[i] & 1;
		uint16_t v = (uint16_t)(data[i + 1] | data[i + 2] << 8);
		struct sbx_ring *x = &r[s];
		if (data[i] & 2) {
			uint64_t off = v > x->end ? 0 : x->end - v;
			uint64_t from = 0;
			long n = sbx_ring_read(x, off, buf, sizeof(buf) - 1, &from);
			REQUIRE(n >= 0);
			REQUIRE(from >= off && from >= x->start && from + (uint64_t)n == x->end);
			REQUIRE(from == off || off < x->start);
			REQUIRE(from >= freed_at[s] || n == 0);
			for (long k = 0; k < n; k++)
				REQUIRE(buf[k] == byte_at(s, from + (uint64_t)k));
			REQUIRE(sbx_ring_read(x, x->end + 1, buf, 1, &from) == -ERANGE);
			continue;
		}
		if (data[i] & 4) {
			sbx_ring_free(x, &b);
			freed_at[s] = x->end;
		}
		for (uint16_t k = 0; k < v; k++)
			buf[k] = byte_at(s, x->end + k);
		uint64_t before = x->end;
		sbx_ring_write(x, &b, buf, v);
		REQUIRE(x->end == before + v);
		REQUIRE(x->end - x->start <= x->cap && x->cap <= limit);
		REQUIRE(b.used <= b.max);
	}
	sbx_ring_free(&r[0], &b);
	sbx_ring_free(&r[1], &b);
	REQUIRE(b.used == 0);
	return 0;
}
