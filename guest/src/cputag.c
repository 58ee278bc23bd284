/* The CPU tag: see cputag.h. */
#include "cputag.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* Version of the layout below: a tag of another layout never matches. */
static const char TAG_MAGIC[8] = {'s', 'b', 'x', 'c', 'p', 'u', '0', '1'};

struct tag_writer {
	uint8_t *at;
	uint8_t *end;
};

static void put_u32(struct tag_writer *w, uint32_t v)
{
	for (int i = 0; i < 4 && w->at < w->end; i++)
		*w->at++ = (uint8_t)(v >> (8 * i));
}

bool sbx_cpu_tag(uint8_t tag[SBX_NODE_TAG_SIZE])
{
	struct tag_writer w = {tag, tag + SBX_NODE_TAG_SIZE};
	memset(tag, 0, SBX_NODE_TAG_SIZE);
	memcpy(w.at, TAG_MAGIC, sizeof(TAG_MAGIC));
	w.at += sizeof(TAG_MAGIC);
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d;
	unsigned max_leaf = 0, leaf1_ecx = 0;
	if (__get_cpuid(0, &a, &b, &c, &d)) {
		max_leaf = a;
		put_u32(&w, a); /* highest leaf, then the vendor string */
		put_u32(&w, b);
		put_u32(&w, d);
		put_u32(&w, c);
	}
	if (max_leaf >= 1 && __get_cpuid(1, &a, &b, &c, &d)) {
		leaf1_ecx = c;
		put_u32(&w, a); /* family, model, stepping; not b: the APIC id is per vCPU */
		put_u32(&w, c);
		put_u32(&w, d);
	}
	if (max_leaf >= 7) {
		__cpuid_count(7, 0, a, b, c, d);
		put_u32(&w, b);
		put_u32(&w, c);
		put_u32(&w, d);
	}
	if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) {
		put_u32(&w, c);
		put_u32(&w, d);
	}
	if (leaf1_ecx & (1u << 27)) { /* OSXSAVE: the kernel's XCR0, AVX usable or not */
		uint32_t lo, hi;
		__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
		put_u32(&w, lo);
		put_u32(&w, hi);
	}
	return max_leaf >= 1;
#else
	return false; /* no CPUID to tell one feature set from another */
#endif
}
