/* libFuzzer target: arbitrary bytes as a template image's sbx/env and sbx/workdir, through the
 * agent's parsers (guest/src/template_image.c). The image comes from a builder VM the user's
 * steps ran in: whatever it holds, the parsers stay inside the buffer, and what they accept holds
 * to the agent's limits (protocol.h SBX_ENV_*). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../guest/src/template_image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *env[SBX_ENV_MAX_COUNT];
	size_t n = 0;
	if (sbx_template_parse_env((const char *)data, size, env, &n, NULL, NULL) == 0) {
		REQUIRE(n <= SBX_ENV_MAX_COUNT);
		for (size_t i = 0; i < n; i++) {
			const char *eq = strchr(env[i], '=');
			REQUIRE(eq && eq > env[i] && (size_t)(eq - env[i]) <= SBX_ENV_NAME_MAX);
			REQUIRE(strlen(eq + 1) <= SBX_ENV_VALUE_MAX);
			REQUIRE(strchr(env[i], '\n') == NULL);
			for (size_t j = 0; j < i; j++) /* one entry per name */
				REQUIRE(strncmp(env[i], env[j], (size_t)(eq - env[i]) + 1) != 0);
		}
		sbx_template_env_free(env, &n);
	}
	char wd[SBX_TEMPLATE_WORKDIR_MAX + 1];
	sbx_template_parse_workdir((const char *)data, size, wd, sizeof(wd));
	REQUIRE(wd[0] == '/' && strlen(wd) <= SBX_TEMPLATE_WORKDIR_MAX && !strchr(wd, '\n'));
	return 0;
}
