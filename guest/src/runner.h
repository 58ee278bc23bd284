/* One execution at a time: code file, child process, output streaming with limits, timeout, and
 * the final EXIT. Driven by the event loop in main.c:
 *
 *   RUNNING --timeout--> TERM_GRACE (SIGTERM sent) --500 ms--> KILLED (SIGKILL sent)
 *      |                      |                                   |
 *      +----------------------+---- main child reaped ------------+--> DRAINING
 *   DRAINING: the group is SIGKILLed; wait for EOF on both pipes, at most 200 ms (a process
 *   that left the group could hold them open), then send EXIT and go back to IDLE.
 *   RUNNING --pre-started bootstrap reports done--> (group SIGKILLed, what the pipes hold taken,
 *   EXIT sent, sweep) --> IDLE: the code's end is known before its process is gone.
 */
#ifndef SBX_RUNNER_H
#define SBX_RUNNER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "agent_request_guest.h"
#include "stream.h"

enum sbx_phase {
	SBX_PHASE_IDLE,
	SBX_PHASE_RUNNING,
	SBX_PHASE_TERM_GRACE,
	SBX_PHASE_KILLED,
	SBX_PHASE_DRAINING,
};


/* A pre-started interpreter waiting for the go (see SBX_MSG_PRESTART); pid 0 when there is none.
 * After the go, its fd 3 stays open as the run's done_fd: the bootstrap reports there the end of
 * the code ("d" + exit status byte) right before it exits, so that the EXIT need not wait for the
 * interpreter's teardown, its reap and the sweep (tens of ms under TCG).
 *
 * Randomness: a RESEED that comes while it waits (a template's, before its save: every clone then
 * holds this process) leaves the process's own generators as they were. Its ready byte says what
 * it can do about that: "r", it holds none a program can see before its code runs, or it can make
 * them fresh when told (the go is then "2" instead of "1"); "n", it cannot, and the RESEED kills
 * it, so that no two clones ever run code in processes with one generator state. */
struct sbx_prestarted {
	pid_t pid;
	uint8_t language;
	bool refreshable; /* its ready byte was "r" */
	bool reseeded;    /* a RESEED came after it started: its go is "2" */
	int go_fd;        /* write end of its fd 3 */
	int out_fd, err_fd;
};

struct sbx_runner {
	const struct sbx_config *cfg;
	struct sbx_channel *ch;
	int timer_fd;
	enum sbx_phase phase;
	bool silent; /* the host that asked is gone: finish without sending anything */
	bool exited; /* the main child has been reaped */
	uint32_t id;
	pid_t pid; /* main child == its process group id */
	int status;
	uint32_t flags; /* enum sbx_exit_flag */
	uint64_t start_ns, end_ns;
	struct sbx_stream out, err;
	int done_fd; /* a pre-started run's report socket, -1 otherwise */
	bool swept;  /* sbx_kill_user_processes() has run for this execution */
	char code_path[300];
	struct sbx_prestarted pre;
};

int sbx_runner_init(struct sbx_runner *r, const struct sbx_config *cfg, struct sbx_channel *ch);
bool sbx_runner_busy(const struct sbx_runner *r);
/* Start the request. On failure nothing is left running and *code/msg describe the ERROR to send. */
int sbx_runner_start(struct sbx_runner *r, uint32_t id, const struct sbx_exec_request *req,
		     uint32_t *code, char *msg, size_t msg_size);
/* PRESTART: start the interpreter of `language` on its bootstrap, to serve the next EXEC. */
int sbx_runner_prestart(struct sbx_runner *r, uint8_t language, uint32_t *code, char *msg,
			size_t msg_size);
/* Kill the pre-started interpreter, if any (its death is then ignored by the reaper hooks). */
void sbx_runner_discard_prestarted(struct sbx_runner *r);
/* SESSION_EXEC with no REPL yet: the pre-started interpreter, if it is of `language` and its
 * bootstrap can become the session's REPL driver (javascript: its start is the dear part of a
 * session's start), is given that go ("3", or "4" after a RESEED, then the driver's path and a
 * newline) and handed over: returns its pid and its fd 3 socket in *control_fd, the REPL's
 * control in and out from then on (repl.h). 0 when there is none to hand over. */
pid_t sbx_runner_hand_over(struct sbx_runner *r, uint8_t language, const char *driver_path,
			   int *control_fd);
/* A RESEED was done: the pre-started interpreter, if any, refreshes its generators at its go, or
 * is killed if it cannot (struct sbx_prestarted). */
void sbx_runner_note_reseed(struct sbx_runner *r);
/* Event loop hooks. */
void sbx_runner_on_child_exit(struct sbx_runner *r, pid_t pid, int status);
void sbx_runner_on_timer(struct sbx_runner *r);
void sbx_runner_on_output(struct sbx_runner *r, struct sbx_stream *s);
/* done_fd readable: the pre-started bootstrap reported the end of the code (or closed it). */
void sbx_runner_on_done(struct sbx_runner *r);
/* The host went away: kill the run and send nothing more for it. */
void sbx_runner_abort(struct sbx_runner *r);

/* Shared with the session REPL (repl.c). */
/* Kill every process of the sandbox uid, whatever session it escaped to, but for the sessions of
 * the background processes (procs.h) (VM only). */
void sbx_kill_user_processes(const struct sbx_config *cfg);
/* Replace path by a fresh root-owned, read-only regular file holding the bytes. */
int sbx_write_code_file(const char *path, const uint8_t *code, size_t len);

#endif /* SBX_RUNNER_H */
