/* The volume words of the kernel command line: see volume_args.h. */
#include "volume_args.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define PREFIX "sbx.vol"

static bool path_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

bool sbx_volume_path_ok(const char *path, size_t len)
{
	if (len < 2 || len > SBX_VOLUME_PATH_MAX || path[0] != '/' || path[len - 1] == '/')
		return false;
	size_t components = 0;
	size_t start = 1;
	for (size_t i = 1; i <= len; i++) {
		if (i < len && path[i] != '/') {
			if (!path_char(path[i]))
				return false;
			continue;
		}
		size_t n = i - start;
		if (n == 0)
			return false; /* "//" */
		if ((n == 1 && path[start] == '.') ||
		    (n == 2 && path[start] == '.' && path[start + 1] == '.'))
			return false;
		components++;
		start = i + 1;
	}
	/* The top level of the read-only image takes no new directory (volumes.c). */
	return components >= 2;
}

static int bad(char *why, size_t why_size, const char *word, size_t len, const char *what)
{
	snprintf(why, why_size, "%s: %.*s", what, (int)(len > 120 ? 120 : len), word);
	return -EINVAL;
}

static int parse_word(const char *w, size_t len, struct sbx_volume_arg *v, char *why,
		      size_t why_size)
{
	/* sbx.vol?=rw:/path */
	size_t p = strlen(PREFIX);
	if (len < p + 1 + 1 + 3 || w[p] < 'a' || w[p] >= (char)('a' + SBX_VOLUMES_MAX) ||
	    w[p + 1] != '=')
		return bad(why, why_size, w, len, "not a volume word");
	const char *mode = w + p + 2;
	if (memcmp(mode, "rw:", 3) != 0 && memcmp(mode, "ro:", 3) != 0)
		return bad(why, why_size, w, len, "volume mode must be rw or ro");
	const char *path = mode + 3;
	size_t path_len = len - (size_t)(path - w);
	if (!sbx_volume_path_ok(path, path_len))
		return bad(why, why_size, w, len, "bad volume mount path");
	memcpy(v->kind, w + 4, SBX_VOLUME_KIND_MAX); /* "vol?" */
	v->kind[SBX_VOLUME_KIND_MAX] = '\0';
	memcpy(v->path, path, path_len);
	v->path[path_len] = '\0';
	v->read_only = mode[1] == 'o';
	return 0;
}

int sbx_volume_args_parse(const char *cmdline, size_t len, struct sbx_volume_arg *out, size_t max,
			  char *why, size_t why_size)
{
	size_t n = 0;
	size_t i = 0;
	while (i < len) {
		while (i < len && (cmdline[i] == ' ' || cmdline[i] == '\t' || cmdline[i] == '\n' ||
				   cmdline[i] == '\0'))
			i++;
		size_t start = i;
		while (i < len && cmdline[i] != ' ' && cmdline[i] != '\t' && cmdline[i] != '\n' &&
		       cmdline[i] != '\0')
			i++;
		const char *w = cmdline + start;
		size_t wlen = i - start;
		if (wlen < strlen(PREFIX) || memcmp(w, PREFIX, strlen(PREFIX)) != 0)
			continue;
		if (n == max)
			return bad(why, why_size, w, wlen, "too many volumes");
		struct sbx_volume_arg v;
		int rc = parse_word(w, wlen, &v, why, why_size);
		if (rc < 0)
			return rc;
		for (size_t j = 0; j < n; j++)
			if (strcmp(out[j].kind, v.kind) == 0 || strcmp(out[j].path, v.path) == 0)
				return bad(why, why_size, w, wlen, "volume named twice");
		out[n++] = v;
	}
	return (int)n;
}
