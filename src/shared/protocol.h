/* exec-sandbox wire protocol: the one definition shared by the host (src/_execsbx) and the guest
 * agent (guest/). Plain C, no Python.
 *
 * Transport: one virtio-serial port named SBX_CHANNEL_PORT_NAME, a reliable byte stream. Both
 * directions carry frames:
 *
 *     offset 0  u32  payload length (bytes after the 12-byte header)
 *     offset 4  u8   type (enum sbx_msg)
 *     offset 5  u8   flags (must be 0; reserved)
 *     offset 6  u16  reserved (must be 0)
 *     offset 8  u32  request id chosen by the host; replies and stream chunks echo it
 *     offset 12      payload
 *
 * All integers are little-endian. Strings and byte runs inside payloads are (u32 length, bytes),
 * never NUL-terminated. Every length is checked against the bytes that remain AND against a hard
 * limit below before anything is allocated: the guest is the attacker, so the host decoder
 * accepts at most SBX_GUEST_FRAME_MAX bytes of payload per frame.
 */
#ifndef SBX_PROTOCOL_H
#define SBX_PROTOCOL_H

#include <stdint.h>

#define SBX_PROTOCOL_VERSION 5u
#define SBX_CHANNEL_PORT_NAME "org.execsandbox.agent.0"
#define SBX_FRAME_HEADER_SIZE 12u

/* Hard limits. Host->guest frames may carry a whole program (code <= 1 MiB plus env). */
#define SBX_HOST_FRAME_MAX (2u * 1024u * 1024u)
/* Guest->host frames: output chunks and small replies only. */
#define SBX_GUEST_FRAME_MAX (64u * 1024u)
#define SBX_OUTPUT_CHUNK_MAX (32u * 1024u)
#define SBX_CODE_MAX (1024u * 1024u)
#define SBX_ENV_MAX_COUNT 100u
#define SBX_ENV_NAME_MAX 256u
#define SBX_ENV_VALUE_MAX (32u * 1024u)
#define SBX_ERROR_MESSAGE_MAX 1024u
#define SBX_STDOUT_LIMIT_DEFAULT (1024u * 1024u)
#define SBX_STDERR_LIMIT_DEFAULT (100u * 1024u)
/* An EXEC's timeout: 1 ms .. 24 h (the API's 1..86400 s; host and guest both check it), or
 * SBX_TIMEOUT_NONE: the code runs until it ends (the API's timeout_seconds=0). */
#define SBX_TIMEOUT_MS_MIN 1u
#define SBX_TIMEOUT_MS_MAX 86400000u
#define SBX_TIMEOUT_NONE 0u

enum sbx_msg {
	/* guest -> host */
	SBX_MSG_READY = 1,  /* u32 protocol version, str agent version. Sent once the channel opens. */
	SBX_MSG_STDOUT = 2, /* raw bytes, 1..SBX_OUTPUT_CHUNK_MAX */
	SBX_MSG_STDERR = 3, /* raw bytes, 1..SBX_OUTPUT_CHUNK_MAX */
	SBX_MSG_EXIT = 4,   /* struct sbx_exit encoded field by field, see below */
	SBX_MSG_ERROR = 5,  /* u32 enum sbx_error, str message (<= SBX_ERROR_MESSAGE_MAX) */
	SBX_MSG_PONG = 6,   /* empty */
	/* Sessions and files (7..31). */
	SBX_MSG_FILE_DATA = 7,    /* raw bytes of a file being read, 1..SBX_FILE_CHUNK_MAX */
	SBX_MSG_FILE_ENTRIES = 8, /* u32 count (1..SBX_LIST_BATCH_MAX), then per entry:
				   * u8 is_dir (0/1), u64 size, str name (1..255 bytes, no '/' or NUL,
				   * never "." or "..") */
	SBX_MSG_FILE_DONE = 9,    /* u64: bytes written (write), sent (read) or entries (list) */
	SBX_MSG_FILE_ERROR = 10,  /* u32 enum sbx_file_error, str message (<= SBX_ERROR_MESSAGE_MAX) */
	/* Host tools and rich outputs (11..15), see "Host socket" below. */
	SBX_MSG_TOOL_CALL = 11, /* u32 call (!= 0), str name, str arguments (JSON) */
	SBX_MSG_OUTPUT = 12,    /* u8 flags (enum sbx_output_flag), [str mime type], bytes data */
	/* Background processes and terminals (13..15), see "Processes" below. */
	SBX_MSG_PROC_INFO = 13, /* u32 count (0..SBX_PROC_TRACKED_MAX), then count entries */
	SBX_MSG_PROC_DATA = 14, /* u64 offset, u8 flags (enum sbx_proc_data_flag), bytes data */
	/* Speed tiers (32..39). */
	SBX_MSG_RESEEDED = 32, /* empty; answers RESEED once the kernel's CRNG is reseeded */

	/* host -> guest */
	SBX_MSG_EXEC = 64, /* see "EXEC payload" below */
	SBX_MSG_PING = 65, /* empty; answered by PONG with the same id */
	/* Sessions and files (66..95). */
	SBX_MSG_SESSION_EXEC = 66,     /* EXEC payload, run in the session's persistent REPL */
	SBX_MSG_FILE_WRITE_BEGIN = 67, /* str path (relative, <= SBX_PATH_MAX), u8 file flags */
	SBX_MSG_FILE_WRITE_DATA = 68,  /* raw bytes, 0..SBX_HOST_FRAME_MAX, same id as BEGIN */
	SBX_MSG_FILE_WRITE_END = 69,   /* u8 1 = commit (rename into place), 0 = abort */
	SBX_MSG_FILE_READ = 70,        /* str path, u8 file flags: FILE_DATA* then FILE_DONE */
	SBX_MSG_FILE_LIST = 71,        /* str path ("" = home): FILE_ENTRIES* then FILE_DONE */
	SBX_MSG_TOOL_RESULT = 72,      /* u32 call, u8 enum sbx_tool_status, str body */
	/* Background processes and terminals (73..79), see "Processes" below. */
	SBX_MSG_PROC_SPAWN = 73,  /* -> PROC_INFO (one entry) or ERROR */
	SBX_MSG_PROC_READ = 74,   /* -> PROC_DATA or ERROR */
	SBX_MSG_PROC_WRITE = 75,  /* -> PONG or ERROR */
	SBX_MSG_PROC_SIGNAL = 76, /* -> PONG or ERROR */
	SBX_MSG_PROC_WAIT = 77,   /* -> PROC_INFO (one entry) or ERROR */
	SBX_MSG_PROC_LIST = 78,   /* empty -> PROC_INFO (every tracked process) */
	SBX_MSG_PROC_RESIZE = 79, /* -> PONG or ERROR */
	/* Speed tiers (96..103). */
	SBX_MSG_RESEED = 96, /* SBX_RESEED_BYTES random bytes; answered by RESEEDED (or ERROR) */
	SBX_MSG_PRESTART = 97, /* u8 language: pre-start the next EXEC's interpreter; answered by
				* PONG (or ERROR). See "Pre-started interpreter" below. */
};

/* RESEED payload (host -> guest), exactly SBX_RESEED_PAYLOAD_SIZE bytes:
 *     SBX_RESEED_BYTES bytes  from the host's CSPRNG
 *     u64                     the host's CLOCK_REALTIME in ns (0: leave the guest clock alone)
 * Sent to a VM restored from a memory snapshot before anything else runs: every clone of one
 * snapshot starts with the same kernel RNG state and the clock of the moment the snapshot was
 * taken. The agent credits the bytes to the input pool (RNDADDENTROPY), forces a CRNG reseed
 * (RNDRESEEDCRNG), sets the clock, and only then answers RESEEDED. */
#define SBX_RESEED_BYTES 64u
#define SBX_RESEED_PAYLOAD_SIZE (SBX_RESEED_BYTES + 8u)

/* Pre-started interpreter (PRESTART): the agent starts the interpreter of `language` (python,
 * javascript or bash) exactly as for a one-shot EXEC (uid 1000, own session, limits, the clean
 * environment, stdin on /dev/null, output pipes) but on a small bootstrap that blocks until the
 * agent gives it the go; the PONG comes once the interpreter has started and waits. The next EXEC of the same language with no env variables then writes the
 * code file, gives the go and is served by that process: the interpreter's start-up is paid
 * before the request. A SESSION_EXEC with no REPL yet takes a waiting node as its REPL driver; any
 * other EXEC, SESSION_EXEC or a new PRESTART kills it first. Sent to pooled VMs, and to python and
 * javascript snapshot templates before their save (docs/design.md). The bootstrap reports the
 * code's end to the agent ("d" + status byte on its fd 3) before the interpreter's teardown: the
 * EXIT does not wait for that (docs/protocol.md, PRESTART). */

/* EXEC payload (host -> guest):
 *     u8   language (enum sbx_language)
 *     u32  timeout in milliseconds (1 .. 300000)
 *     u32  stdout limit in bytes
 *     u32  stderr limit in bytes
 *     u32  env count (<= SBX_ENV_MAX_COUNT), then per variable: str name, str value
 *     str  code (<= SBX_CODE_MAX)
 * The guest runs the code as uid 1000 in a new session with stdin on /dev/null, streams
 * STDOUT/STDERR frames with the same id, and ends with exactly one EXIT (or ERROR when it could not
 * start the code at all).
 */
enum sbx_language {
	SBX_LANG_PYTHON = 1,
	SBX_LANG_JAVASCRIPT = 2,
	SBX_LANG_RAW = 3, /* GNU Bash */
};

/* Every language has a pre-started interpreter (PRESTART), so one check serves EXEC and PRESTART. */
static inline int sbx_language_valid(uint32_t language)
{
	return language >= SBX_LANG_PYTHON && language <= SBX_LANG_RAW;
}

/* EXIT payload (guest -> host):
 *     i32  exit code: the process's status, 128+N when killed by signal N, -1 on timeout
 *     u32  flags (enum sbx_exit_flag)
 *     u64  wall time of the execution in microseconds, measured in the guest
 */
enum sbx_exit_flag {
	SBX_EXIT_TIMED_OUT = 1u << 0,
	SBX_EXIT_STDOUT_LIMIT = 1u << 1, /* stdout passed its limit: the code was killed */
	SBX_EXIT_STDERR_LIMIT = 1u << 2,
	/* SESSION_EXEC only: the REPL process ended during this request (a timeout kills it too),
	 * so the session's state is gone. The exit code alone cannot say so: os._exit(130) and a
	 * SIGINT that killed the REPL both give 130, sys.exit(130) keeps it. */
	SBX_EXIT_REPL_RESET = 1u << 3,
};
#define SBX_EXIT_FLAGS_ALL                                                                         \
	(SBX_EXIT_TIMED_OUT | SBX_EXIT_STDOUT_LIMIT | SBX_EXIT_STDERR_LIMIT | SBX_EXIT_REPL_RESET)
#define SBX_EXIT_PAYLOAD_SIZE 16u

enum sbx_error {
	SBX_ERR_BAD_REQUEST = 1, /* malformed or over-limit frame from the host */
	SBX_ERR_BUSY = 2,        /* an EXEC arrived while another one runs */
	SBX_ERR_SPAWN = 3,       /* the interpreter could not be started */
	SBX_ERR_INTERNAL = 4,
	SBX_ERR_NO_PROCESS = 5, /* PROC_*: no tracked process with that pid (or, for SIGNAL, RESIZE
				 * and WRITE, it is no longer running / its stdin is closed) */
	SBX_ERR_LIMIT = 6,      /* PROC_*: over SBX_PROC_MAX running or SBX_PROC_PENDING_MAX waits */
};
#define SBX_ERR_MAX SBX_ERR_LIMIT

/* Sessions (SESSION_EXEC): the guest keeps one REPL per VM alive between requests. Replies are
 * those of EXEC. A timeout (-1) or the REPL's death (any other exit of the interpreter process)
 * resets the REPL: the next SESSION_EXEC starts a fresh one. */

/* Files. Paths are relative to the guest home, components separated by '/', none empty, "." or
 * "..", none over SBX_PATH_COMPONENT_MAX bytes, no NUL. The guest resolves them one component at a
 * time without following symlinks, so nothing outside the home is ever reached. A write goes to a
 * temporary file in the target directory, renamed over the target on commit: an aborted write
 * leaves nothing. Every file request ends in FILE_DONE or FILE_ERROR (an aborted write gets no
 * reply). */
#define SBX_PATH_MAX 4096u
#define SBX_PATH_COMPONENT_MAX 255u
#define SBX_FILE_SIZE_MAX (500ull * 1024u * 1024u)
#define SBX_FILE_CHUNK_MAX (60u * 1024u)
#define SBX_LIST_BATCH_MAX 200u
#define SBX_LIST_ENTRIES_MAX 10000u

enum sbx_file_flag {
	SBX_FILE_EXECUTABLE = 1u << 0, /* FILE_WRITE_BEGIN: mode 0755 instead of 0644 */
	/* FILE_WRITE_BEGIN and FILE_READ, alone and with an empty path: the file is node's startup
	 * snapshot (docs/design.md, "JavaScript start-up"), not a home path. Its content on the
	 * wire is a SBX_NODE_TAG_SIZE-byte tag of the guest's CPU, then the blob: the guest puts its
	 * own tag in front on a read, and refuses a write whose tag is not its own (V8 aborts on a
	 * blob made for another CPU feature set). The host keeps the bytes and never looks in. */
	SBX_FILE_NODE_SNAPSHOT = 1u << 1,
};
#define SBX_NODE_TAG_SIZE 64u

enum sbx_file_error {
	SBX_FILE_ERR_PATH = 1,      /* invalid path, escapes the home, or a symlink on the way */
	SBX_FILE_ERR_NOT_FOUND = 2, /* no such file or directory */
	SBX_FILE_ERR_IO = 3,        /* the guest could not read or write */
	SBX_FILE_ERR_TOO_LARGE = 4, /* over SBX_FILE_SIZE_MAX, or too many entries */
	SBX_FILE_ERR_PROTOCOL = 5,  /* request out of sequence or malformed */
	SBX_FILE_ERR_REFUSED = 6,   /* node's startup snapshot behind another CPU's tag */
};
#define SBX_FILE_ERR_MAX SBX_FILE_ERR_REFUSED

/* Host socket: user code's one way to the host (docs/protocol.md, "Host tools and rich
 * outputs"). The agent listens on SBX_HOST_SOCKET_NAME (a Unix stream socket uid 1000 may connect
 * to). Clients speak frames of the format above (header included) with the types of enum
 * sbx_local_msg; every request gets exactly one LOCAL_REPLY with its id. The agent checks a
 * request completely, then forwards it on the channel with the id of the execution running now:
 *
 *   LOCAL_CALL   -> TOOL_CALL (the agent numbers the call); TOOL_RESULT -> LOCAL_REPLY
 *   LOCAL_OUTPUT -> OUTPUT frames (BEGIN with the mime type ... END); LOCAL_REPLY once queued
 *
 * so an output acknowledged before the code's end is on the channel before its EXIT. */
/* In the agent's run directory: /run/sbx/host.sock in a VM. */
#define SBX_HOST_SOCKET_NAME "host.sock"

enum sbx_local_msg {
	SBX_LOCAL_CALL = 1,   /* str name, str arguments: JSON {"args": [...], "kwargs": {...}} */
	SBX_LOCAL_OUTPUT = 2, /* str mime type, then the data (the rest of the payload) */
	SBX_LOCAL_REPLY = 3,  /* u8 enum sbx_tool_status, str body */
};

enum sbx_tool_status {
	SBX_TOOL_OK = 0,      /* CALL: body is the result, JSON; OUTPUT: body empty */
	SBX_TOOL_ERROR = 1,   /* the tool raised, or the host refused the call: body is the message */
	SBX_TOOL_REFUSED = 2, /* the agent refused: no execution running, over a limit, malformed */
};

enum sbx_output_flag {
	SBX_OUTPUT_BEGIN = 1u << 0, /* a new output: a str mime type follows the flags */
	SBX_OUTPUT_END = 1u << 1,   /* the output's last frame */
};

/* A tool's name: [A-Za-z_][A-Za-z0-9_]*. A mime type: type/subtype of [a-z0-9.+_-], one '/',
 * neither side empty. */
#define SBX_TOOL_NAME_MAX 64u
#define SBX_TOOL_ARGS_MAX (60u * 1024u)     /* one guest frame */
#define SBX_TOOL_RESULT_MAX (1024u * 1024u) /* body of TOOL_RESULT and of LOCAL_REPLY */
#define SBX_TOOL_CALLS_MAX 16u              /* in flight per execution */
#define SBX_MIME_TYPE_MAX 127u
#define SBX_OUTPUT_DATA_MAX (60u * 1024u) /* data bytes per OUTPUT frame */
#define SBX_OUTPUT_ITEM_MAX (4u * 1024u * 1024u)   /* one output's data */
#define SBX_OUTPUTS_MAX 32u                        /* outputs per execution */
#define SBX_OUTPUT_BYTES_MAX (16u * 1024u * 1024u) /* all outputs of one execution */
#define SBX_HOST_SOCKET_CLIENTS_MAX 16u            /* connections at once */

/* Processes: background processes and terminals a session starts beside its executions. They
 * live in the VM (pause, resume and fork keep them, and the agent's record of them), so every
 * reference is the guest pid; the host holds no state a new host process could not ask for.
 *
 * The agent starts a process as it starts an EXEC's code (uid 1000, its own session and process
 * group, the template's root and environment, no_new_privs, the clean environment plus the
 * request's variables) and keeps, per process, a ring buffer of each output stream: its last
 * SBX_PROC_BUFFER_MAX bytes, addressed by the absolute offset of the stream (bytes produced so
 * far). Readers pull (PROC_READ from an offset, waiting up to wait_ms for data), so any number of
 * readers, before or after a pause, each get what they missed, and neither side holds more than
 * the rings: a reader that fell behind gets a PROC_DATA whose offset is past the one it asked for
 * (the bytes between were dropped). The agent reaps exited processes and keeps their record (exit
 * status, rings) until SBX_PROC_TRACKED_MAX records exist; then the oldest exited record goes.
 *
 * PROC_SPAWN (host -> guest):
 *     u8   flags (enum sbx_spawn_flag)
 *     u16  cols, u16 rows (PTY: the terminal size, 1..SBX_PROC_TTY_MAX each; else both 0)
 *     u32  argc (1..SBX_PROC_ARGV_MAX), then argc str: argv (argv[0] is looked up in PATH;
 *          each 1..SBX_PROC_ARG_MAX bytes, no NUL)
 *     str  cwd: an absolute path (<= SBX_PATH_MAX, no NUL), or empty: the working directory an
 *          EXEC's code gets (the home, or the template's WORKDIR)
 *     u32  env count (<= SBX_ENV_MAX_COUNT), then per variable: str name, str value (as EXEC)
 * Reply: PROC_INFO with one entry once the program is executing (an exec failure, a missing
 * cwd: ERROR SPAWN with the reason), or ERROR LIMIT past SBX_PROC_MAX running processes.
 * With SBX_SPAWN_PTY the process gets a new pseudo-terminal as its controlling terminal and
 * stdin/stdout/stderr (TERM comes from env); its output is all on stdout, stderr stays empty
 * and ends with it.
 *
 * PROC_INFO entry (guest -> host):
 *     u32  pid
 *     u8   flags (enum sbx_proc_flag)
 *     i32  exit code: as EXIT's (128+N when killed by signal N); 0 while running
 *     u64  stdout bytes produced so far, u64 stderr bytes produced so far
 *     str  command: argv joined by spaces, cut to SBX_PROC_COMMAND_MAX bytes
 *
 * PROC_READ (host -> guest): u32 pid, u8 stream (1 stdout, 2 stderr), u64 offset,
 *     u32 max bytes (1..SBX_OUTPUT_CHUNK_MAX), u32 wait_ms (0..SBX_PROC_WAIT_MS_MAX).
 * Reply PROC_DATA: u64 offset of its first byte (>= the one asked for: more means the bytes
 * between were dropped), u8 flags, then 0..max bytes. Sent as soon as a byte at or after the
 * offset exists or the stream has ended (flag EOF: nothing after these bytes will ever come), or
 * empty when wait_ms passed first. An offset past the bytes produced so far: ERROR BAD_REQUEST.
 *
 * PROC_WRITE: u32 pid, u8 flags (enum sbx_proc_write_flag), bytes data (0..SBX_PROC_WRITE_MAX).
 *     PONG once every byte is written to the process's stdin (the agent holds the reply while
 *     the pipe or terminal is full: one write per process at a time), then, with CLOSE_STDIN,
 *     stdin is closed. ERROR NO_PROCESS when stdin is already closed or the process has ended.
 * PROC_SIGNAL: u32 pid, u32 signal (1..64): sent to the process's group. PONG; ERROR NO_PROCESS
 *     once it has ended.
 * PROC_WAIT: u32 pid, u32 wait_ms (0..SBX_PROC_WAIT_MS_MAX): PROC_INFO (one entry) once the
 *     process has ended, or when wait_ms passed (then flagged RUNNING).
 * PROC_RESIZE: u32 pid, u16 cols, u16 rows: the terminal's new size (SIGWINCH follows). PONG;
 *     ERROR NO_PROCESS when it has no terminal or has ended.
 */
enum sbx_spawn_flag {
	SBX_SPAWN_PTY = 1u << 0,
};
enum sbx_proc_flag {
	SBX_PROC_RUNNING = 1u << 0,
	SBX_PROC_PTY = 1u << 1,
	SBX_PROC_STDIN_OPEN = 1u << 2,
};
#define SBX_PROC_FLAGS_ALL (SBX_PROC_RUNNING | SBX_PROC_PTY | SBX_PROC_STDIN_OPEN)
enum sbx_proc_stream {
	SBX_PROC_STDOUT = 1,
	SBX_PROC_STDERR = 2,
};
enum sbx_proc_data_flag {
	SBX_PROC_DATA_EOF = 1u << 0,
};
enum sbx_proc_write_flag {
	SBX_PROC_CLOSE_STDIN = 1u << 0,
};
#define SBX_PROC_MAX 128u              /* running at once */
#define SBX_PROC_TRACKED_MAX 256u      /* records kept, running or ended */
#define SBX_PROC_PENDING_MAX 64u       /* PROC_READ/PROC_WAIT/PROC_WRITE replies held at once */
#define SBX_PROC_ARGV_MAX 256u
#define SBX_PROC_ARG_MAX (128u * 1024u)
#define SBX_PROC_COMMAND_MAX 128u
#define SBX_PROC_TTY_MAX 1000u
#define SBX_PROC_WAIT_MS_MAX 60000u
#define SBX_PROC_WRITE_MAX (60u * 1024u)
#define SBX_PROC_BUFFER_MAX (1024u * 1024u)           /* per output stream */
#define SBX_PROC_BUFFERS_TOTAL_MAX (16u * 1024u * 1024u) /* all rings together: past it, rings
							   * stop growing and drop their oldest */

#endif /* SBX_PROTOCOL_H */
