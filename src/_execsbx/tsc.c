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

static int take_point(struct tsc_point *best, struct sbx_err *err)
{
	best->width = UINT64_MAX;
	for (int i = 0; i < SBX_TSC_TRIES; i++) {
		struct timespec ts;
		uint64_t a = __rdtsc();
		if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
			return sbx_err_sys(err, -errno, "clock_gettime(CLOCK_MONOTONIC)");
		uint64_t b = __rdtsc();
		if (b < a)
			continue;
		if (b - a < best->width) {
			best->width = b - a;
			best->tsc = a + (b - a) / 2;
			best->ns = ts_ns(&ts);
		}
	}
	if (best->width == UINT64_MAX)
		return sbx_err_set(err, -EIO, "the TSC went backwards across every clock reading");
	return 0;
}

int sbx_tsc_khz(uint64_t *khz, struct sbx_err *err)
{
	struct tsc_point p0 = {0}, p1 = {0};
	int rc = take_point(&p0, err);
	if (rc < 0)
		return rc;
	struct timespec req = {0, SBX_TSC_INTERVAL_NS};
	while (nanosleep(&req, &req) < 0 && errno == EINTR)
		;
	if ((rc = take_point(&p1, err)) < 0)
		return rc;
	if (p1.ns <= p0.ns || p1.tsc <= p0.tsc)
		return sbx_err_set(err, -EIO, "the clock or the TSC did not advance over %ld ms",
				   SBX_TSC_INTERVAL_NS / 1000000L);
	uint64_t dns = p1.ns - p0.ns, dtsc = p1.tsc - p0.tsc;
	/* kHz = ticks per ms = dtsc * 1e6 / dns; dtsc < 2^40 for any sane interval, so the
	 * product fits in 64 bits. Round to nearest. */
	if (dtsc > UINT64_MAX / 1000000u)
		return sbx_err_set(err, -EIO, "%llu TSC ticks in %llu ns: not a TSC",
				   (unsigned long long)dtsc, (unsigned long long)dns);
	*khz = (dtsc * 1000000u + dns / 2) / dns;
	return 0;
}

#else

int sbx_tsc_khz(uint64_t *khz, struct sbx_err *err)
{
	(void)khz;
	return sbx_err_set(err, -EOPNOTSUPP, "no TSC to measure on this architecture");
}

#endif
