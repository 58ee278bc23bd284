/* TSC frequency: count TSC ticks across ~25 ms of CLOCK_MONOTONIC. Each end point is the
 * reading whose clock_gettime was bracketed most tightly by two rdtsc (best of a few tries), so
 * a preemption during one reading does not skew the result. */
#define _GNU_SOURCE 1
#include "tsc.h"

#include <errno.h>
#include <time.h>

#if defined(__x86_64__)
#include <x86intrin.h>

#define SBX_TSC_INTERVAL_NS 25000000L
#define SBX_TSC_TRIES 5

struct tsc_point {
	uint64_t tsc; /* midpoint of the bracket */
	uint64_t ns;
	uint64_t width; /* bracket width in ticks */
};

static uint64_t ts_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * 1000000000u + (uint64_t)ts->tv_nsec;
}

static int take_point(struct tsc_point *best)
{
	best->width = UINT64_MAX;
	for (int i = 0; i < SBX_TSC_TRIES; i++) {
		struct timespec ts;
		uint64_t a = __rdtsc();
		if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
			return -errno;
		uint64_t b = __rdtsc();
		if (b < a)
			continue;
		if (b - a < best->width) {
			best->width = b - a;
			best->tsc = a + (b - a) / 2;
			best->ns = ts_ns(&ts);
		}
	}
	return best->width == UINT64_MAX ? -EIO : 0;
}

uint64_t sbx_tsc_khz(void)
{
	struct tsc_point p0 = {0}, p1 = {0};
	if (take_point(&p0) < 0)
		return 0;
	struct timespec req = {0, SBX_TSC_INTERVAL_NS};
	while (nanosleep(&req, &req) < 0 && errno == EINTR)
		;
	if (take_point(&p1) < 0)
		return 0;
	if (p1.ns <= p0.ns || p1.tsc <= p0.tsc)
		return 0;
	uint64_t dns = p1.ns - p0.ns, dtsc = p1.tsc - p0.tsc;
	/* kHz = ticks per ms = dtsc * 1e6 / dns; dtsc < 2^40 for any sane interval, so the
	 * product fits in 64 bits. Round to nearest. */
	if (dtsc > UINT64_MAX / 1000000u)
		return 0;
	return (dtsc * 1000000u + dns / 2) / dns;
}

#else

uint64_t sbx_tsc_khz(void)
{
	return 0;
}

#endif
