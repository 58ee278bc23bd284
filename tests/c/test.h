/* A minimal test harness: TEST functions run by RUN; CHECK* record failures without stopping;
 * SKIP(reason) ends a test that cannot run here, SKIP_ALL(reason) (in main, before the RUNs)
 * every test of the file; each skip prints "SKIP <test>: <reason>". TEST_MAIN_END prints
 * "<name>: N passed, M failed, K skipped" (tests, not checks) and sets the exit code: a skip is
 * neither a pass nor a failure (tests/c/Makefile sums the three). */
#ifndef SBX_TEST_H
#define SBX_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Tests spell argv and envp as arrays of string literals and const strings (execve takes
 * char *const[]), which -Wwrite-strings makes const: in test code only, the two warnings that
 * follow from it are off. */
#pragma GCC diagnostic ignored "-Wdiscarded-qualifiers"
#pragma GCC diagnostic ignored "-Wcast-qual"

static int t_tests_passed, t_tests_failed, t_tests_skipped, t_checks_failed_here;
static const char *t_skip_reason, *t_skip_all_reason;

#define SKIP(reason)                         \
	do {                                 \
		t_skip_reason = (reason);    \
		return;                      \
	} while (0)

#define SKIP_ALL(reason) (t_skip_all_reason = (reason))

#define CHECK(cond)                                                                       \
	do {                                                                              \
		if (!(cond)) {                                                            \
			t_checks_failed_here++;                                           \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                         \
	} while (0)

#define CHECK_EQ(a, b)                                                                       \
	do {                                                                                 \
		long long _a = (long long)(a), _b = (long long)(b);                           \
		if (_a != _b) {                                                              \
			t_checks_failed_here++;                                              \
			fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n",  \
				__FILE__, __LINE__, #a, _a, #b, _b);                         \
		}                                                                            \
	} while (0)

#define CHECK_STR(a, b)                                                                       \
	do {                                                                                  \
		const char *_a = (a), *_b = (b);                                              \
		if (!_a || !_b || strcmp(_a, _b) != 0) {                                      \
			t_checks_failed_here++;                                               \
			fprintf(stderr, "%s:%d: CHECK_STR failed: %s == \"%s\", expected \"%s\"\n", \
				__FILE__, __LINE__, #a, _a ? _a : "(null)", _b ? _b : "(null)"); \
		}                                                                             \
	} while (0)

#define RUN(fn)                                                                        \
	do {                                                                           \
		t_checks_failed_here = 0;                                              \
		t_skip_reason = t_skip_all_reason;                                     \
		if (!t_skip_reason)                                                    \
			fn();                                                          \
		if (t_checks_failed_here) {                                            \
			t_tests_failed++;                                              \
			fprintf(stderr, "FAIL %s\n", #fn);                             \
		} else if (t_skip_reason) {                                            \
			t_tests_skipped++;                                             \
			printf("SKIP %s: %s\n", #fn, t_skip_reason);                   \
		} else {                                                               \
			t_tests_passed++;                                              \
		}                                                                      \
	} while (0)

#define TEST_MAIN_END(name)                                                              \
	do {                                                                             \
		printf("%s: %d passed, %d failed, %d skipped\n", name, t_tests_passed,    \
		       t_tests_failed, t_tests_skipped);                                 \
		return t_tests_failed ? 1 : 0;                                           \
	} while (0)

#endif /* SBX_TEST_H */
