/* Where the host wants each volume disk (docs/design.md, "Volumes"): parsed from the kernel
 * command line, one word per volume, `sbx.<kind>=<rw|ro>:<path>` with kind "vola".."volc" (the
 * disk's serial is "sbx-disk-<kind>"). Pure: no I/O, so it is unit-tested and fuzzed on the host.
 *
 * The command line comes from the host, which is trusted, but the parse is strict anyway: a path
 * is where the agent, as root, makes directories and mounts, so anything unexpected is refused
 * rather than guessed at. The host's own checks (volumes/volume.py) are the same. */
#ifndef SBX_VOLUME_ARGS_H
#define SBX_VOLUME_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#define SBX_VOLUMES_MAX 3u
#define SBX_VOLUME_PATH_MAX 100u
#define SBX_VOLUME_KIND_MAX 4u

struct sbx_volume_arg {
	char kind[SBX_VOLUME_KIND_MAX + 1];    /* "vola".."volc" */
	char path[SBX_VOLUME_PATH_MAX + 1];    /* absolute, >= 2 components of [A-Za-z0-9._-] */
	bool read_only;
};

/* The volume words of cmdline (len bytes, need not be NUL-terminated; other words are skipped)
 * into out[0..max). Returns how many (0..max), or -EINVAL with why filled (a bad or repeated
 * word, more than max). */
int sbx_volume_args_parse(const char *cmdline, size_t len, struct sbx_volume_arg *out, size_t max,
			  char *why, size_t why_size);

/* Whether path is a mount path the parser accepts (the same rules, for the tests). */
bool sbx_volume_path_ok(const char *path, size_t len);

#endif /* SBX_VOLUME_ARGS_H */
