/* What a template image tells the agent (docs: the template disk's layout, `root/`, `sbx/env`,
 * `sbx/workdir`): its environment, its working directory and which interpreters its tree has.
 * The image is made by a builder VM from user-chosen content, so it is read like any other guest
 * input: bounded, line by line, a bad line skipped. Pure but for the interpreter lookup, which
 * only stats inside a directory fd; no mounts, no logging (the caller is told through `warn`),
 * so that host tests and the fuzz target (tests/c/fuzz_guest_template.c) run it directly. */
#ifndef SBX_TEMPLATE_IMAGE_H
#define SBX_TEMPLATE_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

/* The most of sbx/env the agent reads: every variable at its limits, one line each. */
#define SBX_TEMPLATE_ENV_FILE_MAX \
	((size_t)SBX_ENV_MAX_COUNT * (SBX_ENV_NAME_MAX + 1u + SBX_ENV_VALUE_MAX + 1u))
/* sbx/workdir: one absolute path of at most this many bytes. */
#define SBX_TEMPLATE_WORKDIR_MAX 255u
#define SBX_TEMPLATE_WORKDIR_DEFAULT "/home/user"

/* A template VM's state, fixed at boot (template.c) and read by whoever starts user code. */
struct sbx_template {
	bool active;     /* a template disk was found: user code runs chrooted into root */
	char error[200]; /* non-empty: setting it up failed; every run is refused with this */
	char root[128];  /* the template's root as the agent sees it */
	char workdir[SBX_TEMPLATE_WORKDIR_MAX + 1]; /* inside root */
	char *env[SBX_ENV_MAX_COUNT];               /* "NAME=VALUE", owned */
	size_t env_count;
	char interpreter[4][32]; /* by enum sbx_language, the path inside root; "" when absent */
	bool raw_is_bash;        /* the raw interpreter is bash (sessions and pre-starts need it) */
};

/* Told about each line skipped: its number (from 1) and a static reason. */
typedef void (*sbx_template_warn_fn)(void *ctx, size_t line, const char *why);

/* sbx/env: buf[0..len) as NAME=VALUE lines (NAME [A-Za-z_][A-Za-z0-9_]* of at most
 * SBX_ENV_NAME_MAX bytes, VALUE valid UTF-8 without NUL of at most SBX_ENV_VALUE_MAX bytes; the
 * last line may lack its newline; empty lines are ignored). A later line of the same name replaces
 * the earlier one; lines past SBX_ENV_MAX_COUNT names and anything malformed are skipped (warn,
 * which may be NULL). Fills env[] with malloc'd "NAME=VALUE" strings and *count. 0, or -ENOMEM
 * with nothing left allocated. */
int sbx_template_parse_env(const char *buf, size_t len, char **env, size_t *count,
			   sbx_template_warn_fn warn, void *ctx);
void sbx_template_env_free(char **env, size_t *count);

/* sbx/workdir: its first line (newline optional), an absolute path without NUL of at most
 * SBX_TEMPLATE_WORKDIR_MAX bytes, into out (size > SBX_TEMPLATE_WORKDIR_MAX). 0, or -EINVAL
 * (out is then the default, /home/user). */
int sbx_template_parse_workdir(const char *buf, size_t len, char *out, size_t size);

/* The interpreter of `language` (enum sbx_language) in the tree at root_fd: python3, node, and
 * for raw bash else sh, the first of /usr/local/bin, /usr/bin, /bin that holds an executable
 * regular file by that name, symlinks followed without leaving the tree. Its path inside the tree
 * into out; *is_bash says which shell raw got. 0, -ENOENT when there is none, -ENAMETOOLONG. */
int sbx_template_find_interpreter(int root_fd, uint8_t language, char *out, size_t size,
				  bool *is_bash);
/* The program the message "this template has no X" names for a language. */
const char *sbx_template_interpreter_name(uint8_t language);

#endif /* SBX_TEMPLATE_IMAGE_H */
