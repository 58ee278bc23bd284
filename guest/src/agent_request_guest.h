/* Decoding and validation of what the host sends: EXEC and PRESTART payloads, the path of the
 * FILE_* requests and the PROC_* requests (layouts in protocol.h). Pure: no I/O, so the host tests and the fuzz target
 * (tests/c/fuzz_guest_request.c) exercise it directly. */
#ifndef SBX_AGENT_REQUEST_GUEST_H
#define SBX_AGENT_REQUEST_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

struct sbx_env_var {
	const uint8_t *name; /* points into the frame payload; [A-Za-z_][A-Za-z0-9_]* */
	uint32_t name_len;
	const uint8_t *value; /* no NUL bytes */
	uint32_t value_len;
};

/* Every pointer refers to the frame payload and lives as long as it does. */
struct sbx_exec_request {
	uint8_t language; /* enum sbx_language */
	uint32_t timeout_ms;
	uint32_t stdout_limit;
	uint32_t stderr_limit;
	uint32_t env_count;
	struct sbx_env_var env[SBX_ENV_MAX_COUNT];
	const uint8_t *code;
	uint32_t code_len;
};


/* 0, or -EPROTO/-EMSGSIZE with *why set to a static explanation for the ERROR message. */
int sbx_parse_exec(const uint8_t *payload, size_t len, struct sbx_exec_request *req,
		   const char **why);

/* PRESTART payload: exactly one byte, a language with a pre-started interpreter (python,
 * javascript or raw: all three). 0, or -EPROTO with *why describing the problem. */
int sbx_parse_prestart(const uint8_t *payload, size_t len, uint8_t *language, const char **why);

/* A FILE_* path split into its components, in place: comp[i] point into buf. */
#define SBX_PATH_COMPONENTS_MAX (SBX_PATH_MAX / 2 + 1)
struct sbx_path_parts {
	char buf[SBX_PATH_MAX + 1];
	char *comp[SBX_PATH_COMPONENTS_MAX];
	size_t n;
};

/* 0 if path is a valid protocol path, else -EINVAL: an empty, ".", ".." or over-long component,
 * a NUL byte, a path over SBX_PATH_MAX, or an empty path unless allow_empty. */
int sbx_path_check(const uint8_t *path, uint32_t len, bool allow_empty);
/* A FILE_* payload: str path [, u8 extra when with_u8], nothing after. 0; -EPROTO when the
 * payload is malformed; -EINVAL when the path is not valid (sbx_path_check). */
int sbx_parse_file_path(const uint8_t *payload, size_t len, bool with_u8, bool allow_empty,
			struct sbx_path_parts *p, uint8_t *extra);
/* FILE_WRITE_BEGIN and FILE_READ: str path, u8 flags, none outside `allowed`. With
 * SBX_FILE_NODE_SNAPSHOT the path is empty and no other flag is set (the file is node's startup
 * snapshot); otherwise the path is a non-empty valid path. 0, -EPROTO or -EINVAL as above. */
int sbx_parse_file_target(const uint8_t *payload, size_t len, uint8_t allowed,
			  struct sbx_path_parts *p, uint8_t *flags);

/* A byte run inside the frame payload. */
struct sbx_bytes {
	const uint8_t *p;
	uint32_t n;
};

/* PROC_SPAWN. Every pointer refers to the frame payload. argv entries are 1..SBX_PROC_ARG_MAX
 * bytes without NUL; cwd is empty or an absolute path without NUL; env as EXEC's. */
struct sbx_proc_spawn_request {
	uint8_t flags; /* enum sbx_spawn_flag */
	uint16_t cols, rows;
	uint32_t argc;
	struct sbx_bytes argv[SBX_PROC_ARGV_MAX];
	struct sbx_bytes cwd;
	uint32_t env_count;
	struct sbx_env_var env[SBX_ENV_MAX_COUNT];
};

/* The other PROC_* requests; `type` says which fields count (protocol.h, "Processes"). */
struct sbx_proc_request {
	uint8_t type;
	uint32_t pid;
	uint8_t stream;     /* READ: enum sbx_proc_stream */
	uint64_t offset;    /* READ */
	uint32_t max;       /* READ: 1..SBX_OUTPUT_CHUNK_MAX */
	uint32_t wait_ms;   /* READ, WAIT: 0..SBX_PROC_WAIT_MS_MAX */
	uint8_t flags;      /* WRITE: enum sbx_proc_write_flag */
	struct sbx_bytes data; /* WRITE: 0..SBX_PROC_WRITE_MAX bytes, the rest of the payload */
	uint32_t signal;    /* SIGNAL: 1..64 */
	uint16_t cols, rows; /* RESIZE: 1..SBX_PROC_TTY_MAX each */
};

/* 0, or -EPROTO/-EMSGSIZE with *why set to a static explanation for the ERROR message. */
int sbx_parse_proc_spawn(const uint8_t *payload, size_t len, struct sbx_proc_spawn_request *req,
			 const char **why);
/* PROC_READ .. PROC_RESIZE (not SPAWN); `type` is the frame's. 0, or -EPROTO/-EMSGSIZE with
 * *why set. */
int sbx_parse_proc_request(uint8_t type, const uint8_t *payload, size_t len,
			   struct sbx_proc_request *req, const char **why);

#endif /* SBX_AGENT_REQUEST_GUEST_H */
