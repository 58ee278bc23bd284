/* Host -> guest frames on the agent channel (EXEC, PING, RESEED, PRESTART, FILE_*, TOOL_RESULT,
 * NET_CONFIG), validated against protocol.h's and net_protocol.h's limits before encoding. */
#ifndef SBX_REQUEST_H
#define SBX_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "sbx_err.h"

struct sbx_env_var {
	const uint8_t *name;
	size_t name_len;
	const uint8_t *value;
	size_t value_len;
};

struct sbx_exec_req {
	uint32_t id;
	uint32_t language; /* enum sbx_language */
	uint32_t timeout_ms;
	uint32_t stdout_limit;
	uint32_t stderr_limit;
	const struct sbx_env_var *env;
	size_t env_count;
	const uint8_t *code;
	size_t code_len;
	int session; /* nonzero: SESSION_EXEC (run in the session's REPL) instead of EXEC */
};

/* Append one EXEC frame to b. Returns 0, or -EINVAL (bad language/timeout/env name: e says
 * which), -EMSGSIZE (a field or the whole frame over its limit: e says which) or -ENOMEM.
 * On failure b is left as it was. */
int sbx_encode_exec(struct sbx_buf *b, const struct sbx_exec_req *r, struct sbx_err *e);
/* One file-transfer request (layouts in protocol.h). The pointers are the caller's. */
struct sbx_file_req {
	uint8_t type;       /* SBX_MSG_FILE_WRITE_BEGIN .. SBX_MSG_FILE_LIST */
	uint32_t id;        /* the transfer's id, the same for every frame of a write */
	const uint8_t *path; /* WRITE_BEGIN, READ, LIST: relative to the guest home ("" = home for
			      * LIST; "" with SBX_FILE_NODE_SNAPSHOT: node's startup snapshot) */
	size_t path_len;
	uint8_t flag; /* WRITE_BEGIN, READ: enum sbx_file_flag bits; WRITE_END: 1 commit, 0 abort */
	const uint8_t *data; /* WRITE_DATA */
	size_t data_len;
};

/* Append the request's frame. Returns 0, or -EINVAL (another type, an unknown flag, an empty
 * path where one is needed, a NUL in the path: e says which), -EMSGSIZE (path over PATH_MAX,
 * data over HOST_FRAME_MAX) or -ENOMEM. On failure b is left as it was. */
int sbx_encode_file_request(struct sbx_buf *b, const struct sbx_file_req *r, struct sbx_err *e);
/* Append one PING frame (0 or -ENOMEM). */
int sbx_encode_ping(struct sbx_buf *b, uint32_t id, struct sbx_err *e);
/* Append one RESEED frame; n must be SBX_RESEED_BYTES (-EINVAL otherwise). */
int sbx_encode_reseed(struct sbx_buf *b, uint32_t id, const uint8_t *seed, size_t n,
		      uint64_t realtime_ns, struct sbx_err *e);
/* PRESTART: one byte, the language whose interpreter the guest pre-starts (-EINVAL for
 * another). */
int sbx_encode_prestart(struct sbx_buf *b, uint32_t id, uint8_t language, struct sbx_err *e);

/* TOOL_RESULT: the host's answer to the guest's TOOL_CALL `call` of execution `id`. The body is
 * the caller's. */
struct sbx_tool_result_req {
	uint32_t id;     /* the execution's request id, as the TOOL_CALL carried it */
	uint32_t call;   /* the TOOL_CALL's number (never 0) */
	uint32_t status; /* SBX_TOOL_OK (body: the result, JSON) or SBX_TOOL_ERROR (the message) */
	const uint8_t *body;
	size_t body_len;
};

/* Append one TOOL_RESULT frame. Returns 0, or with e saying which: -EINVAL (call 0, a status
 * other than OK or ERROR: REFUSED is the agent's alone), -EMSGSIZE (a body over
 * SBX_TOOL_RESULT_MAX) or -ENOMEM. On failure b is left as it was. */
int sbx_encode_tool_result(struct sbx_buf *b, const struct sbx_tool_result_req *r,
			   struct sbx_err *e);

/* A string of a request (not NUL-terminated). */
struct sbx_bytes {
	const uint8_t *data;
	size_t len;
};

/* NET_CONFIG's values (net_protocol.h, "NET_CONFIG payload"), as the host's network policy chose
 * them (exec_sandbox/network/config_frame.py). The pointers are the caller's. */
struct sbx_net_config_req {
	uint32_t id;                     /* any request id: the answer (PONG or ERROR) echoes it */
	int outbound;                    /* nonzero: SBX_NET_CONFIG_OUTBOUND */
	int reattach;                    /* nonzero: SBX_NET_CONFIG_REATTACH (a restored VM) */
	const struct sbx_bytes *names;   /* patterns: lowercase DNS names, or "*" alone */
	size_t name_count;
	const uint32_t *ports;           /* extra outbound ports, 1..65535 */
	size_t port_count;
	const uint8_t *ca_bundle;        /* PEM; empty: the guest keeps its image's */
	size_t ca_len;
};

/* Append one NET_CONFIG frame. Returns 0, or with e saying which: -EMSGSIZE (more than
 * SBX_NET_NAMES_MAX names or SBX_NET_EXTRA_PORTS_MAX ports, a name over SBX_NET_NAME_MAX, a bundle
 * over SBX_NET_CA_BUNDLE_MAX), -EINVAL (a pattern that is not a lowercase DNS name of labels of
 * 1..63 letters, digits and inner hyphens, nor "*" alone; a port outside 1..65535; a NUL in the
 * bundle: the guest refuses all of them) or -ENOMEM. On failure b is left as it was. */
int sbx_encode_net_config(struct sbx_buf *b, const struct sbx_net_config_req *r,
			  struct sbx_err *e);

/* One PROC_* request (protocol.h, "Processes"): type says which fields count. The pointers are
 * the caller's. */
struct sbx_proc_req {
	uint8_t type;  /* SBX_MSG_PROC_SPAWN .. SBX_MSG_PROC_RESIZE */
	uint32_t id;
	uint32_t pid;  /* all but SPAWN and LIST */
	uint8_t flags; /* SPAWN: enum sbx_spawn_flag; WRITE: enum sbx_proc_write_flag */
	uint16_t cols, rows;          /* SPAWN with SBX_SPAWN_PTY, RESIZE: 1..SBX_PROC_TTY_MAX */
	const struct sbx_bytes *argv; /* SPAWN: 1..SBX_PROC_ARGV_MAX, each 1..SBX_PROC_ARG_MAX */
	size_t argc;
	const uint8_t *cwd; /* SPAWN: absolute, or empty */
	size_t cwd_len;
	const struct sbx_env_var *env; /* SPAWN, as EXEC's */
	size_t env_count;
	uint8_t stream;    /* READ: SBX_PROC_STDOUT or SBX_PROC_STDERR */
	uint64_t offset;   /* READ */
	uint32_t max;      /* READ: 1..SBX_OUTPUT_CHUNK_MAX */
	uint32_t wait_ms;  /* READ, WAIT: 0..SBX_PROC_WAIT_MS_MAX */
	uint32_t signal;   /* SIGNAL: 1..64 */
	const uint8_t *data; /* WRITE: 0..SBX_PROC_WRITE_MAX bytes */
	size_t data_len;
};

/* Append the request's frame. Returns 0, or with e saying which: -EINVAL (another type, an
 * unknown flag, a field out of its range, a NUL in an argument, cwd or env name/value, a
 * relative cwd), -EMSGSIZE (over a count or length limit) or -ENOMEM. On failure b is left as
 * it was. */
int sbx_encode_proc_request(struct sbx_buf *b, const struct sbx_proc_req *r, struct sbx_err *e);

#endif /* SBX_REQUEST_H */
