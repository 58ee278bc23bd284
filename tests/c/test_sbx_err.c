/* The error struct of the C convention (sbx_err.c). */
#include <errno.h>
#include <string.h>

#include "sbx_err.h"
#include "test.h"

static void test_set_returns_the_errno_and_keeps_the_message(void)
{
	struct sbx_err e = {0};
	CHECK_EQ(sbx_err_set(&e, -EINVAL, "unknown language %u", 9u), -EINVAL);
	CHECK_EQ(e.code, EINVAL);
	CHECK_EQ(e.syscall, 0);
	char buf[300];
	CHECK_STR(sbx_err_text(&e, buf, sizeof(buf)), "unknown language 9");
}

static void test_sys_names_the_step_and_the_text_appends_strerror(void)
{
	struct sbx_err e = {0};
	CHECK_EQ(sbx_err_sys(&e, -ENOENT, "execve"), -ENOENT);
	CHECK_EQ(e.code, ENOENT);
	CHECK_EQ(e.syscall, 1);
	CHECK_STR(e.msg, "execve");
	char buf[300];
	CHECK_STR(sbx_err_text(&e, buf, sizeof(buf)), "execve: No such file or directory");
	sbx_err_clear(&e);
	CHECK_EQ(e.code, 0);
	CHECK_STR(e.msg, "");
}

static void test_a_long_message_is_cut_not_overrun(void)
{
	struct sbx_err e = {0};
	char big[1000];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	sbx_err_set(&e, -EIO, "%s", big);
	CHECK_EQ(strlen(e.msg), sizeof(e.msg) - 1);
	char small[8];
	CHECK_EQ(strlen(sbx_err_text(&e, small, sizeof(small))), sizeof(small) - 1);
}

int main(void)
{
	RUN(test_set_returns_the_errno_and_keeps_the_message);
	RUN(test_sys_names_the_step_and_the_text_appends_strerror);
	RUN(test_a_long_message_is_cut_not_overrun);
	TEST_MAIN_END("test_sbx_err");
}
