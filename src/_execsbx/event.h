/* Guest -> host frames turned into events: the one place that validates a frame's payload.
 * The Python binding (py_events.c) turns a struct sbx_event into a Python value; the fuzzer
 * runs the same code. */
#ifndef SBX_EVENT_H
#define SBX_EVENT_H

#include <stdint.h>

#include "frame.h"

/* Longest agent version string accepted in READY. */
#define SBX_AGENT_VERSION_MAX 256u

enum sbx_event_kind {
	SBX_EV_READY = SBX_MSG_READY,
	SBX_EV_STDOUT = SBX_MSG_STDOUT,
	SBX_EV_STDERR = SBX_MSG_STDERR,
	SBX_EV_EXIT = SBX_MSG_EXIT,
	SBX_EV_ERROR = SBX_MSG_ERROR,
	SBX_EV_PONG = SBX_MSG_PONG,
	SBX_EV_RESEEDED = SBX_MSG_RESEEDED,
	SBX_EV_FILE_DATA = SBX_MSG_FILE_DATA,
	SBX_EV_FILE_ENTRIES = SBX_MSG_FILE_ENTRIES,
	SBX_EV_FILE_DONE = SBX_MSG_FILE_DONE,
	SBX_EV_FILE_ERROR = SBX_MSG_FILE_ERROR,
	SBX_EV_TOOL_CALL = SBX_MSG_TOOL_CALL,
	SBX_EV_OUTPUT = SBX_MSG_OUTPUT,
	SBX_EV_PROC_INFO = SBX_MSG_PROC_INFO,
	SBX_EV_PROC_DATA = SBX_MSG_PROC_DATA,
};

/* data/len point into the frame's payload (valid as long as the frame is). */
struct sbx_event {
	enum sbx_event_kind kind;
	uint32_t id;
	uint32_t protocol_version; /* READY */
	uint32_t error_code;       /* ERROR: enum sbx_error; FILE_ERROR: enum sbx_file_error */
	uint32_t count;            /* FILE_ENTRIES, PROC_INFO: number of entries (all validated) */
	uint64_t value;            /* FILE_DONE; PROC_DATA: the stream offset of its first byte */
	struct sbx_exit exit;      /* EXIT */
	uint32_t call;             /* TOOL_CALL: the call's number (never 0) */
	uint32_t flags;            /* OUTPUT: enum sbx_output_flag bits; PROC_DATA: enum
				    * sbx_proc_data_flag bits (no others) */
	const uint8_t *name;       /* TOOL_CALL: the tool's name ([A-Za-z_][A-Za-z0-9_]*);
				    * OUTPUT with BEGIN: the mime type (type/subtype, [a-z0-9.+_-]),
				    * else name_len 0. ASCII, checked. */
	uint32_t name_len;
	const uint8_t *data;       /* READY: agent version; STDOUT/STDERR/FILE_DATA/OUTPUT: bytes;
				    * ERROR/FILE_ERROR: message; FILE_ENTRIES: the encoded entries;
				    * TOOL_CALL: the arguments (JSON text, not parsed here);
				    * PROC_INFO: the encoded entries; PROC_DATA: the stream's bytes */
	uint32_t len;
};

/* 0 and *ev filled, or -EPROTO (unknown or host->guest type, wrong payload length, trailing
 * bytes, invalid field) / -EMSGSIZE (a string over its limit). Never allocates. */
int sbx_event_decode(const struct sbx_frame *f, struct sbx_event *ev);

/* One directory entry of a FILE_ENTRIES event. */
struct sbx_dir_entry {
	uint8_t is_dir;
	uint64_t size;
	const uint8_t *name;
	uint32_t name_len;
};

/* Walk the entries of a decoded FILE_ENTRIES event: start with c = {ev->data, ev->len} and call
 * ev->count times. The decoder has validated them all, so this cannot fail on a decoded event. */
int sbx_dir_entry_next(struct sbx_cursor *c, struct sbx_dir_entry *e);

/* One process of a PROC_INFO event (protocol.h, "Processes"). */
struct sbx_proc_entry {
	uint32_t pid;       /* never 0 */
	uint8_t flags;      /* enum sbx_proc_flag bits, no others */
	int32_t exit_code;  /* 0 while RUNNING; else 0..255 (128+N: killed by signal N) */
	uint64_t stdout_bytes, stderr_bytes; /* produced so far */
	const uint8_t *command; /* argv joined by spaces, <= SBX_PROC_COMMAND_MAX, no NUL */
	uint32_t command_len;
};

/* Walk the entries of a decoded PROC_INFO event like sbx_dir_entry_next: start with
 * c = {ev->data, ev->len}, call ev->count times; cannot fail on a decoded event. */
int sbx_proc_entry_next(struct sbx_cursor *c, struct sbx_proc_entry *e);

/* The event's tag in the Python tuple: "ready", "stdout", ... */
const char *sbx_event_kind_name(enum sbx_event_kind kind);

#endif /* SBX_EVENT_H */
