/* Sanity test of the TSC frequency measurement (tsc.c). */
#include "tsc.h"
#include "test.h"

static void test_plausible(void)
{
	uint64_t a = sbx_tsc_khz();
#if defined(__x86_64__)
	/* Any x86_64 TSC of the last 15 years runs between 500 MHz and 10 GHz. */
	CHECK(a > 500000 && a < 10000000);
	uint64_t b = sbx_tsc_khz();
	/* Two measurements agree within 1% (generous for a loaded 2-core machine). */
	uint64_t d = a > b ? a - b : b - a;
	CHECK(d * 100 < a);
#else
	CHECK_EQ(a, 0);
#endif
}

int main(void)
{
	RUN(test_plausible);
	TEST_MAIN_END("test_tsc");
}
