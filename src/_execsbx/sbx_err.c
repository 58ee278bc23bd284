/* See sbx_err.h. */
#include "sbx_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

__attribute__((format(printf, 4, 0))) static int record(struct sbx_err *e, int neg_errno, int syscall,
							      const char *fmt, va_list ap)
{
	e->code = neg_errno < 0 ? -neg_errno : neg_errno;
	e->syscall = syscall;
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	return neg_errno;
}

int sbx_err_set(struct sbx_err *e, int neg_errno, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = record(e, neg_errno, 0, fmt, ap);
	va_end(ap);
	return rc;
}

int sbx_err_sys(struct sbx_err *e, int neg_errno, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = record(e, neg_errno, 1, fmt, ap);
	va_end(ap);
	return rc;
}

const char *sbx_err_text(const struct sbx_err *e, char *buf, size_t len)
{
	if (e->syscall)
		snprintf(buf, len, "%s: %s", e->msg, strerror(e->code));
	else
		snprintf(buf, len, "%s", e->msg);
	return buf;
}

void sbx_err_clear(struct sbx_err *e)
{
	e->code = 0;
	e->syscall = 0;
	e->msg[0] = 0;
}
