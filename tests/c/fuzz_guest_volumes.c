/* libFuzzer target: arbitrary bytes as the guest's kernel command line, through the agent's
 * volume word parser (guest/src/volume_args.c): it stays inside the buffer, and every volume it
 * accepts is one the agent may safely mount (a known kind, an absolute path the path check
 * accepts, no kind or path twice). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../../guest/src/volume_args.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sbx_volume_arg v[SBX_VOLUMES_MAX];
	char why[160];
	int n = sbx_volume_args_parse((const char *)data, size, v, SBX_VOLUMES_MAX, why, sizeof(why));
	REQUIRE(n >= -22 && n <= (int)SBX_VOLUMES_MAX);
	for (int i = 0; i < n; i++) {
		REQUIRE(strlen(v[i].kind) == 4 && memcmp(v[i].kind, "vol", 3) == 0);
		REQUIRE(v[i].kind[3] >= 'a' && v[i].kind[3] < (char)('a' + SBX_VOLUMES_MAX));
		REQUIRE(sbx_volume_path_ok(v[i].path, strlen(v[i].path)));
		for (int j = 0; j < i; j++)
			REQUIRE(strcmp(v[i].kind, v[j].kind) != 0 && strcmp(v[i].path, v[j].path) != 0);
	}
	return 0;
}
