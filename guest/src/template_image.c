/* Reading a template image: see template_image.h. */
#include "template_image.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static bool name_char(unsigned char c, bool first)
{
	return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
	       (!first && c >= '0' && c <= '9');
}

/* Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) without NUL. */
static bool utf8_valid(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned char c = s[i];
		if (c == 0)
			return false;
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t len;
		uint32_t cp;
		if (c >= 0xC2 && c <= 0xDF) {
			len = 2;
			cp = c & 0x1Fu;
		} else if (c >= 0xE0 && c <= 0xEF) {
			len = 3;
			cp = c & 0x0Fu;
		} else if (c >= 0xF0 && c <= 0xF4) {
			len = 4;
			cp = c & 0x07u;
		} else {
			return false;
		}
		if (n - i < len)
			return false;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xC0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3Fu);
		}
		if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
		    (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
			return false;
		i += len;
	}
	return true;
}

void sbx_template_env_free(char **env, size_t *count)
{
	for (size_t i = 0; i < *count; i++) {
		free(env[i]);
		env[i] = NULL;
	}
	*count = 0;
}

/* One line (without its newline): NULL when good, else why not. */
static const char *check_line(const unsigned char *s, size_t n, size_t *name_len)
{
	const unsigned char *eq = memchr(s, '=', n);
	if (!eq)
		return "no '='";
	size_t nl = (size_t)(eq - s);
	if (nl == 0 || nl > SBX_ENV_NAME_MAX)
		return "empty or over-long name";
	for (size_t i = 0; i < nl; i++)
		if (!name_char(s[i], i == 0))
			return "name not [A-Za-z_][A-Za-z0-9_]*";
	size_t vl = n - nl - 1;
	if (vl > SBX_ENV_VALUE_MAX)
		return "value over the size limit";
	if (!utf8_valid(eq + 1, vl))
		return "value not UTF-8, or with a NUL byte";
	*name_len = nl;
	return NULL;
}

int sbx_template_parse_env(const char *buf, size_t len, char **env, size_t *count,
			   sbx_template_warn_fn warn, void *ctx)
{
	const unsigned char *p = (const unsigned char *)buf, *end = p + len;
	size_t line = 0;
	*count = 0;
	while (p < end) {
		const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
		const unsigned char *stop = nl ? nl : end;
		size_t n = (size_t)(stop - p);
		line++;
		if (n > 0) {
			size_t name_len = 0;
			const char *why = check_line(p, n, &name_len);
			size_t slot = *count;
			for (size_t i = 0; !why && i < *count; i++)
				if (strncmp(env[i], (const char *)p, name_len + 1) == 0)
					slot = i;
			if (!why && slot == *count && *count == SBX_ENV_MAX_COUNT)
				why = "more variables than the limit";
			if (why) {
				if (warn)
					warn(ctx, line, why);
			} else {
				char *e = malloc(n + 1);
				if (!e) {
					sbx_template_env_free(env, count);
					return -ENOMEM;
				}
				memcpy(e, p, n);
				e[n] = '\0';
				if (slot < *count)
					free(env[slot]);
				else
					(*count)++;
				env[slot] = e;
			}
		}
		p = nl ? nl + 1 : end;
	}
	return 0;
}

int sbx_template_parse_workdir(const char *buf, size_t len, char *out, size_t size)
{
	snprintf(out, size, "%s", SBX_TEMPLATE_WORKDIR_DEFAULT);
	const char *nl = memchr(buf, '\n', len);
	size_t n = nl ? (size_t)(nl - buf) : len;
	if (n == 0 || buf[0] != '/' || n > SBX_TEMPLATE_WORKDIR_MAX || n >= size ||
	    memchr(buf, '\0', n) != NULL)
		return -EINVAL;
	memcpy(out, buf, n);
	out[n] = '\0';
	return 0;
}

const char *sbx_template_interpreter_name(uint8_t language)
{
	switch (language) {
	case SBX_LANG_PYTHON:
		return "python3";
	case SBX_LANG_JAVASCRIPT:
		return "node";
	default:
		return "bash or sh";
	}
}

/* An executable regular file at path inside the tree, symlinks resolved as if the tree were /. */
static bool executable_in(int root_fd, const char *path)
{
	struct open_how how = {
		.flags = O_PATH | O_CLOEXEC,
		.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
	};
	int fd = (int)syscall(SYS_openat2, root_fd, path, &how, sizeof(how));
	if (fd < 0)
		return false;
	struct stat st;
	bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) != 0;
	close(fd);
	return ok;
}

int sbx_template_find_interpreter(int root_fd, uint8_t language, char *out, size_t size,
				  bool *is_bash)
{
	static const char *const dirs[] = {"/usr/local/bin", "/usr/bin", "/bin"};
	const char *names[2] = {NULL, NULL};
	switch (language) {
	case SBX_LANG_PYTHON:
		names[0] = "python3";
		break;
	case SBX_LANG_JAVASCRIPT:
		names[0] = "node";
		break;
	case SBX_LANG_RAW:
		names[0] = "bash";
		names[1] = "sh";
		break;
	default:
		return -EINVAL;
	}
	*is_bash = false;
	for (size_t k = 0; k < 2 && names[k]; k++) {
		for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
			int n = snprintf(out, size, "%s/%s", dirs[i], names[k]);
			if (n < 0 || (size_t)n >= size)
				return -ENAMETOOLONG;
			if (executable_in(root_fd, out)) {
				*is_bash = language == SBX_LANG_RAW && k == 0;
				return 0;
			}
		}
	}
	out[0] = '\0';
	return -ENOENT;
}
