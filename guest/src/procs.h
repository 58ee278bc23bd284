/* Background processes and terminals (protocol.h, "Processes"): the table of the processes the
 * host spawned, their output rings, and the replies held for PROC_READ, PROC_WAIT and PROC_WRITE.
 *
 * A process is started like an EXEC's code (spawn.c: uid 1000, its own session and process group,
 * the template's root and environment, the limits) but belongs to no execution: an EXEC's end, a
 * REPL reset or a timeout leaves it alone (the sweep of uid 1000 spares its session while it runs
 * or holds its output open, sbx_procs_sessions). Its output is read whenever it comes, at most
 * SBX_PROCS_READ_CAP bytes per stream per loop turn (a flood never starves the channel, the EXECs
 * or the other processes), into rings that drop their oldest bytes when full (proc_ring.h): the
 * host pulls, so nothing here waits for it. The table lives in the VM's RAM: a memory snapshot
 * carries it, and replies held when it was taken may be sent after a restore (the host ignores
 * ids it does not know).
 */
#ifndef SBX_PROCS_H
#define SBX_PROCS_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "proc_ring.h"

/* Bytes read from one stream in one loop turn. */
#define SBX_PROCS_READ_CAP (32u * 1024u)
/* pollfds the table may add: each record's stdout, stderr and stdin at most. */
#define SBX_PROCS_POLL_MAX (3u * SBX_PROC_TRACKED_MAX)

struct sbx_proc {
	pid_t pid;          /* 0: a free slot */
	bool running;       /* not reaped yet */
	bool pty;
	int32_t exit_code;  /* EXIT's encoding, once !running */
	uint64_t seq;       /* spawn order (PROC_LIST) */
	uint64_t ended;     /* exit order: the oldest ended record goes first */
	int in_fd;          /* stdin: the pipe's write end or the pty master; -1 once closed */
	int out_fd, err_fd; /* read ends (pty: out_fd is the master, err_fd -1); -1 at EOF */
	/* A terminal's master, which in_fd and out_fd only borrow: open until the process is
	 * reaped even after the output's end, since closing it hangs the terminal up, and that
	 * SIGHUP would kill a process that closed its terminal on its way out. */
	int master_fd;
	bool out_eof, err_eof;
	struct sbx_ring out, err;
	char command[SBX_PROC_COMMAND_MAX];
	uint32_t command_len;
};

enum sbx_held_kind {
	SBX_HELD_NONE = 0,
	SBX_HELD_READ,
	SBX_HELD_WAIT,
	SBX_HELD_WRITE,
};

/* A reply the agent owes: answered when its condition holds or at its deadline. */
struct sbx_held {
	uint8_t kind; /* enum sbx_held_kind */
	uint32_t id;
	pid_t pid;
	uint64_t deadline_ns; /* READ, WAIT (CLOCK_MONOTONIC) */
	uint64_t seq;         /* arrival order: a process's writes go in it */
	uint8_t stream;       /* READ */
	uint64_t offset;      /* READ */
	uint32_t max;         /* READ */
	uint8_t *data;        /* WRITE: the bytes still to write (owned) */
	uint32_t len, done;   /* WRITE */
	bool close_stdin;     /* WRITE */
};

struct sbx_procs {
	const struct sbx_config *cfg;
	struct sbx_channel *ch;
	struct sbx_proc proc[SBX_PROC_TRACKED_MAX];
	struct sbx_held held[SBX_PROC_PENDING_MAX];
	struct sbx_ring_budget budget;
	uint64_t seq;
	/* Which record and stream each pollfd of the last sbx_procs_poll() stands for. */
	struct {
		uint16_t slot;
		uint8_t which; /* 0 stdout, 1 stderr, 2 stdin */
	} map[SBX_PROCS_POLL_MAX];
	int mapped;
};

void sbx_procs_init(struct sbx_procs *t, const struct sbx_config *cfg, struct sbx_channel *ch);
/* PROC_SPAWN .. PROC_RESIZE: always answered, at once or held. */
void sbx_procs_handle(struct sbx_procs *t, const struct sbx_frame *f);
/* Fill p with the fds to watch (returns how many, <= SBX_PROCS_POLL_MAX) and lower *timeout_ms
 * to the nearest held reply's deadline. */
int sbx_procs_poll(struct sbx_procs *t, struct pollfd *p, int *timeout_ms);
/* After poll(): read what the streams have (capped per turn), write held stdin bytes, then send
 * every held reply whose condition holds or whose deadline passed. */
void sbx_procs_handle_poll(struct sbx_procs *t, const struct pollfd *p, int n);
/* The reaper's hook: a tracked process ended (others are ignored). */
void sbx_procs_on_child_exit(struct sbx_procs *t, pid_t pid, int status);
/* The host (re)connected or went away: the held replies were for it, drop them unsent. */
void sbx_procs_drop_held(struct sbx_procs *t);
/* Test mode's end: kill every tracked process's group and free the table. */
void sbx_procs_abort(struct sbx_procs *t);

/* The sessions the sweep of uid 1000 (sbx_kill_user_processes) must spare: those of the tracked
 * processes still running or holding their output open. Writes at most max; returns the count. */
size_t sbx_procs_sessions(pid_t *out, size_t max);

#endif /* SBX_PROCS_H */
