/* The host socket (docs/protocol.md, "Host tools and rich outputs"): user code's one way to the
 * host. The agent listens on <run_dir>/host.sock (mode 0666: uid 1000 connects; /run/sbx is
 * root's 0755 directory, so nobody else can put something in its place) and serves at most
 * SBX_HOST_SOCKET_CLIENTS_MAX connections, each a stream of frames in both directions:
 *
 *   LOCAL_CALL   -> TOOL_CALL on the channel (numbered here); the host's TOOL_RESULT -> LOCAL_REPLY
 *   LOCAL_OUTPUT -> OUTPUT frames (BEGIN ... END) queued on the channel, then LOCAL_REPLY
 *
 * always with the id of the execution running now (one-shot or session); every request gets
 * exactly one reply. Nothing here blocks PID 1: sockets are non-blocking, replies wait in a
 * bounded buffer per connection, and a client's requests are read only while the channel is
 * under its high-water mark and the client takes its replies.
 *
 * Memory: one connection at a time may buffer a request larger than an ordinary call (an
 * output's data, up to 4 MiB); the others wait for it, so the agent never holds more than one
 * such request, whatever user code opens. Replies clients leave unread, with what the calls in
 * flight may bring, stay within 17 results of 1 MiB, all connections together: past that a new
 * call is refused. */
#ifndef SBX_HOST_SOCKET_H
#define SBX_HOST_SOCKET_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "frame.h"

struct sbx_runner;
struct sbx_repl;

/* The listener and every connection. */
#define SBX_HOST_SOCKET_POLL_MAX (1 + SBX_HOST_SOCKET_CLIENTS_MAX)

struct sbx_host_conn {
	int fd; /* -1: a free slot */
	struct sbx_reader reader;
	struct sbx_buf out; /* replies not written yet */
	size_t out_off;
	bool dead; /* gone or broken: closed once none of its frames is in use */
};

/* A call sent to the host and not answered yet. */
struct sbx_host_call {
	uint32_t call;   /* 0: a free slot */
	uint32_t req_id; /* the LOCAL_CALL's id, echoed in its reply */
	int conn;        /* the connection waiting for it, -1 once it has closed */
};

struct sbx_host_socket {
	struct sbx_channel *ch;
	const struct sbx_runner *runner;
	const struct sbx_repl *repl;
	int listen_fd; /* -1 when the socket could not be made: the agent goes on without it */
	char path[108];
	struct sbx_host_conn conns[SBX_HOST_SOCKET_CLIENTS_MAX];
	struct sbx_host_call calls[SBX_TOOL_CALLS_MAX];
	uint32_t next_call;
	int big; /* the connection allowed to buffer a large request, -1 */
	/* The execution the calls and the output counters belong to. */
	bool exec_active;
	uint32_t exec_id;
	uint32_t outputs;
	uint64_t output_bytes;
	/* What the last sbx_host_socket_poll put at each index: -1 the listener, else a slot. */
	int polled[SBX_HOST_SOCKET_POLL_MAX];
};

/* Listen on <run_dir>/host.sock. A failure is logged and leaves the agent without the socket (user
 * code then finds nothing to connect to); the agent goes on either way. One instance per agent:
 * it is also what sbx_exec_ended and sbx_host_socket_env refer to. */
void sbx_host_socket_init(struct sbx_host_socket *hs, const struct sbx_config *cfg,
			  struct sbx_channel *ch, const struct sbx_runner *runner,
			  const struct sbx_repl *repl);
/* Fill p (room for SBX_HOST_SOCKET_POLL_MAX) with what to wait for; returns the count. */
int sbx_host_socket_poll(struct sbx_host_socket *hs, struct pollfd *p);
/* Act on p[0..n) as filled by sbx_host_socket_poll and poll(); then take the requests that
 * waited for the channel or for a client to read its replies. */
void sbx_host_socket_handle(struct sbx_host_socket *hs, const struct pollfd *p, int n);
/* TOOL_RESULT from the host (dispatch.c): the reply of the call, if it is still open. */
void sbx_host_socket_on_tool_result(struct sbx_host_socket *hs, const struct sbx_frame *f);

/* The runner and the REPL call this when execution `id` ends (its EXIT sent, or dropped for a
 * host that left): its open calls are answered SBX_TOOL_REFUSED, its output counters reset. */
void sbx_exec_ended(uint32_t id);

/* "EXEC_SANDBOX_HOST_SOCKET=<path>" for the environment of user code when the socket is not at
 * its default, /run/sbx/host.sock (test mode), else NULL: the runtimes default to that path. */
const char *sbx_host_socket_env(void);

#endif /* SBX_HOST_SOCKET_H */
