/* The volume words of the guest's kernel command line (guest/src/volume_args.c), on the host:
 * what the host writes (volumes/volume.py kernel_cmdline) parses, and everything else is refused. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "test.h"
#include "../../guest/src/volume_args.h"

static int parse(const char *line, struct sbx_volume_arg *v)
{
	char why[160];
	return sbx_volume_args_parse(line, strlen(line), v, SBX_VOLUMES_MAX, why, sizeof(why));
}

static void test_the_host_words_parse(void)
{
	struct sbx_volume_arg v[SBX_VOLUMES_MAX];
	const char *line = "console=hvc0 quiet sbx.builder=1 sbx.vola=rw:/mnt/data "
			   "sbx.volb=ro:/home/user/ref.d sbx.volc=ro:/srv/a_b-c\n";
	CHECK_EQ(parse(line, v), 3);
	CHECK_STR(v[0].kind, "vola");
	CHECK_STR(v[0].path, "/mnt/data");
	CHECK(!v[0].read_only);
	CHECK_STR(v[1].kind, "volb");
	CHECK_STR(v[1].path, "/home/user/ref.d");
	CHECK(v[1].read_only);
	CHECK_STR(v[2].path, "/srv/a_b-c");
	CHECK_EQ(parse("console=hvc0 quiet", v), 0);
	/* Not NUL-terminated: the length bounds the read. */
	char raw[] = {'s', 'b', 'x', '.', 'v', 'o', 'l', 'a', '=', 'r', 'w', ':', '/', 'a', '/', 'b'};
	char why[64];
	CHECK_EQ(sbx_volume_args_parse(raw, sizeof(raw), v, SBX_VOLUMES_MAX, why, sizeof(why)), 1);
	CHECK_STR(v[0].path, "/a/b");
}

static void test_bad_words_are_refused(void)
{
	static const char *const bad[] = {
		"sbx.vold=rw:/mnt/data",      /* no such kind */
		"sbx.vola=rx:/mnt/data",      /* mode */
		"sbx.vola=rw:mnt/data",       /* relative */
		"sbx.vola=rw:/data",          /* one component */
		"sbx.vola=rw:/mnt/../etc",    /* .. */
		"sbx.vola=rw:/mnt/./x",       /* . */
		"sbx.vola=rw:/mnt//x",        /* empty component */
		"sbx.vola=rw:/mnt/x/",        /* trailing slash */
		"sbx.vola=rw:/mnt/a,b",       /* a character outside the set */
		"sbx.vola=rw:/mnt/a b",       /* cut at the space: "/mnt/a" then "b" is fine... */
		"sbx.vola=rw:",               /* no path */
		"sbx.vola",                   /* no value */
		"sbx.volume=1",               /* an unknown sbx.vol word */
		"sbx.vola=rw:/mnt/a sbx.vola=ro:/mnt/b", /* a kind twice */
		"sbx.vola=rw:/mnt/a sbx.volb=ro:/mnt/a", /* a path twice */
	};
	struct sbx_volume_arg v[SBX_VOLUMES_MAX];
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = parse(bad[i], v);
		if (i == 9) {
			CHECK_EQ(rc, 1); /* words end at spaces: the host never writes one in a path */
			continue;
		}
		if (rc != -EINVAL)
			fprintf(stderr, "accepted: %s\n", bad[i]);
		CHECK_EQ(rc, -EINVAL);
	}
	char longpath[200] = "sbx.vola=rw:/mnt/";
	memset(longpath + strlen(longpath), 'x', 120);
	CHECK_EQ(parse(longpath, v), -EINVAL);
}

static void test_at_most_max(void)
{
	struct sbx_volume_arg v[2];
	char why[160];
	const char *line = "sbx.vola=rw:/mnt/a sbx.volb=rw:/mnt/b sbx.volc=rw:/mnt/c";
	CHECK_EQ(sbx_volume_args_parse(line, strlen(line), v, 2, why, sizeof(why)), -EINVAL);
	CHECK(strstr(why, "too many") != NULL);
}

int main(void)
{
	RUN(test_the_host_words_parse);
	RUN(test_bad_words_are_refused);
	RUN(test_at_most_max);
	TEST_MAIN_END("test_guest_volumes");
}
