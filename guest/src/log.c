/* Console logging. PID 1's stderr is /dev/console (hvc0), which the host captures; in test mode it
 * is the test's stderr. One write() per line so that lines from concurrent writers do not mix. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

void sbx_log(const char *fmt, ...)
{
	char line[512];
	int off = snprintf(line, sizeof(line), "sbx-agent: ");
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line + off, sizeof(line) - (size_t)off - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)off + (n < 0 ? 0 : (size_t)n);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	/* Nothing to do on failure: the console is the only place to report to. */
	ssize_t w = write(STDERR_FILENO, line, len);
	(void)w;
}

uint64_t sbx_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
