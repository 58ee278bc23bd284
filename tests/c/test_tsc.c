/* Sanity test of the TSC frequency measurement (tsc.c). */
#include <errno.h>

#include "tsc.h"
#include "test.h"

static void test_plausible(void)
{
	uint64_t a = 0, b = 0;
	struct sbx_err err = {0};
#if defined(__x86_64__)
	CHECK_EQ(sbx_tsc_khz(&a, &err), 0);
	/* Any x86_64 TSC of the last 15 years runs between 500 MHz and 10 GHz. */
	CHECK(a > 500000 && a < 10000000);
	CHECK_EQ(sbx_tsc_khz(&b, &err), 0);
	/* Two measurements agree within 1% (generous for a loaded 2-core machine). */
	uint64_t d = a > b ? a - b : b - a;
	CHECK(d * 100 < a);
	CHECK_EQ(err.code, 0);
#else
	CHECK_EQ(sbx_tsc_khz(&a, &err), -EOPNOTSUPP);
	CHECK(err.code == EOPNOTSUPP && err.msg[0] != 0);
	(void)b;
#endif
}

int main(void)
{
	RUN(test_plausible);
	TEST_MAIN_END("test_tsc");
}
