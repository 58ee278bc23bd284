/* What the agent reads from a template image (guest/src/template_image.c), on the host: the
 * sbx/env parser and its limits, sbx/workdir, and the interpreter lookup inside a tree. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "../../guest/src/template_image.h"

static size_t warned;
static void count_warning(void *ctx, size_t line, const char *why)
{
	(void)ctx;
	(void)line;
	(void)why;
	warned++;
}

static size_t parse(const char *text, char **env, size_t *count)
{
	warned = 0;
	CHECK_EQ(sbx_template_parse_env(text, strlen(text), env, count, count_warning, NULL), 0);
	return warned;
}

static void test_env_lines(void)
{
	char *env[SBX_ENV_MAX_COUNT];
	size_t n = 0;
	size_t w = parse("PATH=/opt/bin:/bin\n\nLANG=C\nEMPTY=\nA_1=x=y\nLANG=en_US.UTF-8", env, &n);
	CHECK_EQ(w, 0);
	CHECK_EQ(n, 4);
	CHECK_STR(env[0], "PATH=/opt/bin:/bin");
	CHECK_STR(env[1], "LANG=en_US.UTF-8"); /* the later line replaced it, in its place */
	CHECK_STR(env[2], "EMPTY=");
	CHECK_STR(env[3], "A_1=x=y");
	sbx_template_env_free(env, &n);
	CHECK_EQ(n, 0);
}

static void test_env_bad_lines_are_skipped(void)
{
	char *env[SBX_ENV_MAX_COUNT];
	size_t n = 0;
	/* no '=', empty name, a digit first, a dash, invalid UTF-8, a surrogate, an overlong '/' */
	size_t w = parse("NOEQ\n=x\n1A=x\nA-B=x\nBAD=\xff\nSUR=\xed\xa0\x80\nOVL=\xc0\xaf\nOK=\xc3\xa9\n",
			 env, &n);
	CHECK_EQ(w, 7);
	CHECK_EQ(n, 1);
	CHECK_STR(env[0], "OK=\xc3\xa9");
	sbx_template_env_free(env, &n);
	/* A NUL inside a value. */
	static const char nul[] = "A=x\0y\nB=z\n";
	warned = 0;
	CHECK_EQ(sbx_template_parse_env(nul, sizeof(nul) - 1, env, &n, count_warning, NULL), 0);
	CHECK_EQ(warned, 1);
	CHECK_EQ(n, 1);
	CHECK_STR(env[0], "B=z");
	sbx_template_env_free(env, &n);
}

static void test_env_limits(void)
{
	char *env[SBX_ENV_MAX_COUNT];
	size_t n = 0;
	/* A name at the limit passes, one byte over does not; the same for a value. */
	size_t len = 2 * (SBX_ENV_NAME_MAX + SBX_ENV_VALUE_MAX + 8);
	char *buf = malloc(len), *p = buf;
	memset(p, 'N', SBX_ENV_NAME_MAX);
	p += SBX_ENV_NAME_MAX;
	*p++ = '=';
	memset(p, 'v', SBX_ENV_VALUE_MAX);
	p += SBX_ENV_VALUE_MAX;
	*p++ = '\n';
	memset(p, 'M', SBX_ENV_NAME_MAX + 1);
	p += SBX_ENV_NAME_MAX + 1;
	memcpy(p, "=1\nV=", 5);
	p += 5;
	memset(p, 'v', SBX_ENV_VALUE_MAX + 1);
	p += SBX_ENV_VALUE_MAX + 1;
	warned = 0;
	CHECK_EQ(sbx_template_parse_env(buf, (size_t)(p - buf), env, &n, count_warning, NULL), 0);
	CHECK_EQ(warned, 2);
	CHECK_EQ(n, 1);
	CHECK_EQ(strlen(env[0]), SBX_ENV_NAME_MAX + 1 + SBX_ENV_VALUE_MAX);
	sbx_template_env_free(env, &n);
	free(buf);
	/* More names than the limit: the rest skipped, while replacing a known one still works. */
	char many[16 * (SBX_ENV_MAX_COUNT + 10)];
	size_t off = 0;
	for (unsigned i = 0; i < SBX_ENV_MAX_COUNT + 5; i++)
		off += (size_t)snprintf(many + off, sizeof(many) - off, "V%u=%u\n", i, i);
	off += (size_t)snprintf(many + off, sizeof(many) - off, "V0=last\n");
	warned = 0;
	CHECK_EQ(sbx_template_parse_env(many, off, env, &n, count_warning, NULL), 0);
	CHECK_EQ(warned, 5);
	CHECK_EQ(n, SBX_ENV_MAX_COUNT);
	CHECK_STR(env[0], "V0=last");
	sbx_template_env_free(env, &n);
}

static void test_workdir(void)
{
	char wd[SBX_TEMPLATE_WORKDIR_MAX + 1];
	CHECK_EQ(sbx_template_parse_workdir("/app\n", 5, wd, sizeof(wd)), 0);
	CHECK_STR(wd, "/app");
	CHECK_EQ(sbx_template_parse_workdir("/srv/x", 6, wd, sizeof(wd)), 0);
	CHECK_STR(wd, "/srv/x");
	CHECK_EQ(sbx_template_parse_workdir("app\n", 4, wd, sizeof(wd)), -EINVAL);
	CHECK_STR(wd, "/home/user");
	CHECK_EQ(sbx_template_parse_workdir("", 0, wd, sizeof(wd)), -EINVAL);
	CHECK_EQ(sbx_template_parse_workdir("/a\0b", 4, wd, sizeof(wd)), -EINVAL);
	char longer[SBX_TEMPLATE_WORKDIR_MAX + 2];
	memset(longer, 'a', sizeof(longer));
	longer[0] = '/';
	CHECK_EQ(sbx_template_parse_workdir(longer, sizeof(longer), wd, sizeof(wd)), -EINVAL);
	CHECK_EQ(sbx_template_parse_workdir(longer, SBX_TEMPLATE_WORKDIR_MAX + 1, wd, sizeof(wd)), -EINVAL);
	CHECK_EQ(sbx_template_parse_workdir(longer, SBX_TEMPLATE_WORKDIR_MAX, wd, sizeof(wd)), 0);
}

/* A file in the tree: mode, or a symlink target when link is set. */
static void put(int root, const char *path, mode_t mode, const char *link)
{
	char dir[128];
	snprintf(dir, sizeof(dir), "%s", path);
	for (char *s = strchr(dir + 1, '/'); s; s = strchr(s + 1, '/')) {
		*s = '\0';
		mkdirat(root, dir, 0755);
		*s = '/';
	}
	if (link) {
		CHECK_EQ(symlinkat(link, root, path), 0);
		return;
	}
	int fd = openat(root, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
	CHECK(fd >= 0);
	close(fd);
}

static void test_interpreters(void)
{
	char tmpl[] = "/tmp/sbx-template-test.XXXXXX";
	CHECK(mkdtemp(tmpl) != NULL);
	int root = open(tmpl, O_PATH | O_DIRECTORY);
	CHECK(root >= 0);
	char path[64];
	bool bash = true;
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_PYTHON, path, sizeof(path), &bash),
		 -ENOENT);
	CHECK_STR(path, "");
	/* /usr/local/bin first; a file that is not executable does not count. */
	put(root, "usr/bin/python3", 0755, NULL);
	put(root, "usr/local/bin/python3", 0644, NULL);
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_PYTHON, path, sizeof(path), &bash), 0);
	CHECK_STR(path, "/usr/bin/python3");
	CHECK(!bash);
	/* An absolute symlink resolves inside the tree: to nothing here, though the host has it. */
	put(root, "usr/local/bin/node", 0, "/usr/bin/env");
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_JAVASCRIPT, path, sizeof(path), &bash),
		 -ENOENT);
	put(root, "opt/node/bin/node", 0755, NULL);
	put(root, "usr/bin/node", 0, "/opt/node/bin/node");
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_JAVASCRIPT, path, sizeof(path), &bash),
		 0);
	CHECK_STR(path, "/usr/bin/node");
	/* raw: sh when there is no bash, bash wherever it is before any sh. */
	put(root, "bin/sh", 0755, NULL);
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_RAW, path, sizeof(path), &bash), 0);
	CHECK_STR(path, "/bin/sh");
	CHECK(!bash);
	put(root, "bin/bash", 0755, NULL);
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_RAW, path, sizeof(path), &bash), 0);
	CHECK_STR(path, "/bin/bash");
	CHECK(bash);
	/* A directory by the name is not an interpreter. */
	mkdirat(root, "usr/local/bin/bash", 0755);
	CHECK_EQ(sbx_template_find_interpreter(root, SBX_LANG_RAW, path, sizeof(path), &bash), 0);
	CHECK_STR(path, "/bin/bash");
	close(root);
	char cmd[96];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpl);
	CHECK_EQ(system(cmd), 0);
}

int main(void)
{
	RUN(test_env_lines);
	RUN(test_env_bad_lines_are_skipped);
	RUN(test_env_limits);
	RUN(test_workdir);
	RUN(test_interpreters);
	TEST_MAIN_END("test_guest_template");
}
