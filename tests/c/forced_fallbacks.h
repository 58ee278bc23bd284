/* SBX_TEST_FORCE=no_pidfd,no_waitid_pidfd,no_close_range,refuse_namespaces (any subset): the
 * test binaries that spawn (test_qemu_spawn, test_vm, test_jail) then run every test the way an
 * older kernel would make them, through the fallbacks of qemu_spawn.c (struct
 * sbx_forced_fallbacks, compiled in by tests/c only). `make test` runs them once per fallback. */
#ifndef SBX_FORCED_FALLBACKS_H
#define SBX_FORCED_FALLBACKS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu_spawn.h"

/* Set the flags named in SBX_TEST_FORCE; returns the summary name, "<name>" or
 * "<name>[<SBX_TEST_FORCE>]". Exits 2 on an unknown name (a typo would test nothing). */
static const char *force_fallbacks_from_env(const char *name)
{
	static char label[256];
	const char *env = getenv("SBX_TEST_FORCE");
	if (!env || !*env)
		return name;
	char list[128];
	snprintf(list, sizeof(list), "%s", env);
	for (char *save = NULL, *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		if (strcmp(w, "no_pidfd") == 0)
			sbx_forced_fallbacks.no_pidfd = 1;
		else if (strcmp(w, "no_waitid_pidfd") == 0)
			sbx_forced_fallbacks.no_waitid_pidfd = 1;
		else if (strcmp(w, "no_close_range") == 0)
			sbx_forced_fallbacks.no_close_range = 1;
		else if (strcmp(w, "refuse_namespaces") == 0)
			sbx_forced_fallbacks.refuse_namespaces = 1;
		else {
			fprintf(stderr, "SBX_TEST_FORCE: unknown fallback '%s'\n", w);
			exit(2);
		}
	}
	snprintf(label, sizeof(label), "%s[%s]", name, env);
	return label;
}

#endif /* SBX_FORCED_FALLBACKS_H */
