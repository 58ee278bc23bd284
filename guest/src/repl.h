/* The session REPL: one long-lived interpreter per VM, driven by a small driver script
 * (/usr/lib/sbx/driver.{py,js,sh}) that keeps the user's state between SESSION_EXEC requests.
 *
 * The driver runs as uid 1000 in its own session, like one-shot code, with two extra fds (one
 * socket on fd 3 for both when a pre-started node became the driver, sbx_repl_adopt):
 *   fd 3  control in:  the agent writes one line per request, "<seq> <token> <nonce> <dir>":
 *                      <dir> holds the root-owned files session-code (the code) and session-env
 *                      (NAME=VALUE\0...); <dir>/repl/<token>.out and .err are FIFOs made for this
 *                      request alone; <nonce> is random and appears nowhere else
 *   fd 4  control out: the driver answers "<seq> <nonce> <status>\n" once the code has finished
 *                      (status 0..255)
 * Per request the driver opens the two FIFOs as its stdout/stderr, runs the code, flushes, puts
 * /dev/null back on fds 1 and 2 and only then reports. The agent believes a report only for the
 * current seq and nonce, once the driver has read the request line and while the REPL's fds 1 and
 * 2 are not the request's FIFOs; other lines are ignored (user code that forges one from inside
 * the REPL still has its output on the FIFOs; a thread or worker it left running, which may write
 * while the driver holds no FIFO, before it installs them or after it releases them, does not
 * know the nonce, which the driver keeps in its own variables). After the EXIT the FIFOs are unlinked and their read ends
 * closed: a background process of that request writing later gets EPIPE, and nothing of one
 * request lands in another's result.
 *
 *   IDLE --SESSION_EXEC--> RUNNING --believable status line--> drain FIFOs, EXIT --> IDLE
 *                             |--timeout--> SIGKILL all user processes --reaped--> EXIT(-1)
 *                             '--REPL died--> kill the rest, drain, EXIT(status) --> IDLE
 * A REPL that died or timed out is gone (state lost); a fresh one is started at once, while the
 * host reads the result, or by the next request if that failed.
 * Output over a limit is dropped and the driver gets SIGINT (python and javascript turn that into
 * an exception of the user's code and keep their state); the EXIT carries the limit flag.
 */
#ifndef SBX_REPL_H
#define SBX_REPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "agent_request_guest.h"
#include "runner.h"


enum sbx_repl_phase {
	SBX_REPL_IDLE,
	SBX_REPL_RUNNING,
	SBX_REPL_KILLING, /* timed out: waiting for the driver to be reaped */
};

struct sbx_repl {
	const struct sbx_config *cfg;
	struct sbx_channel *ch;
	int timer_fd;
	const char *driver_dir; /* where driver.{py,js,sh} live */
	/* The REPL process; pid 0 when none is running. */
	pid_t pid;
	uint8_t language;
	int control_w, control_r; /* the agent's ends, -1 when closed */
	bool control_is_socket;   /* both on one socket (sbx_repl_adopt), else two pipes */
	struct sbx_stream out, err;
	char line[64]; /* "<seq> <nonce> <status>" */
	size_t line_len;
	uint32_t seq; /* of the current (or last) request, echoed in its completion line */
	/* The current request. */
	enum sbx_repl_phase phase;
	bool silent;
	bool interrupted; /* SIGINT sent for an output limit */
	bool ignored_logged; /* an unbelievable completion line of this request was logged */
	uint32_t id;
	uint32_t flags;
	uint64_t start_ns;
	char code_path[300], env_path[300];
	/* The current request's output FIFOs (empty when none) and what they are, to tell whether
	 * the REPL still holds them. */
	char fifo_dir[300], token[17], fifo_out[340], fifo_err[340];
	char nonce[33]; /* the current request's, echoed in its completion line */
	struct stat out_st, err_st;
	int out_hold, err_hold; /* the agent's own write ends, see make_fifo() */
};

int sbx_repl_init(struct sbx_repl *r, const struct sbx_config *cfg, struct sbx_channel *ch);
bool sbx_repl_busy(const struct sbx_repl *r);
/* Start a request; on failure *code/msg describe the ERROR to send and nothing runs. */
/* The path of the driver of `language` (false if it does not fit). */
bool sbx_repl_driver_path(const struct sbx_repl *r, uint8_t language, char *buf, size_t size);
/* Take a process that already runs the driver of `language` as this REPL (no REPL running):
 * a pre-started interpreter handed over (sbx_runner_hand_over), whose one socket `control_fd`
 * carries the request lines in and the completion lines out. */
void sbx_repl_adopt(struct sbx_repl *r, uint8_t language, pid_t pid, int control_fd);
int sbx_repl_start(struct sbx_repl *r, uint32_t id, const struct sbx_exec_request *req,
		   uint32_t *code, char *msg, size_t msg_size);
void sbx_repl_on_control(struct sbx_repl *r);
void sbx_repl_on_output(struct sbx_repl *r, struct sbx_stream *s);
void sbx_repl_on_timer(struct sbx_repl *r);
void sbx_repl_on_child_exit(struct sbx_repl *r, pid_t pid, int status);
/* The host went away: stop the REPL (the next host gets a fresh one). */
void sbx_repl_abort(struct sbx_repl *r);

#endif /* SBX_REPL_H */
