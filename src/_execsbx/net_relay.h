/* The host's network relay: the byte path between a VM's NET port and the host TCP
 * sockets of its streams, driven by one io_uring per scheduler.
 *
 * Python owns the policy and the event loop; this owns the bytes. Python registers the ring's
 * eventfd on its loop, hands in each VM's NET port fd (sbx_net_relay_add) and, per stream, a
 * socket it has already connected (sbx_net_open_reply) or accepted (sbx_net_connect). When the
 * eventfd is readable it calls sbx_net_ring_run and takes the resulting events out with
 * sbx_net_ring_next_event: OPEN (the guest wants name:port), CONNECTED (the guest answered a
 * CONNECT), CLOSED (a stream ended, with its byte counts), REFUSED (an OPEN the relay answered
 * itself, for the connection log), VIOLATION (the guest broke the protocol; its relay is dead and
 * Python kills the VM) and PORT_CLOSED (the VM's end went away).
 * DATA, CREDIT, SHUTDOWN and CLOSE never reach Python.
 *
 * Memory per relay is bounded: at most SBX_NET_STREAMS_MAX streams, each with one receive buffer
 * of SBX_NET_DATA_MAX and one send ring of SBX_NET_WINDOW bytes (allocated when the stream
 * starts), plus an outgoing frame queue capped at SBX_NET_RELAY_OUT_MAX.
 *
 * Errors (docs/c-conventions.md): a call returns 0 or a negative errno and fills the caller's
 * struct sbx_err. What goes wrong while completions are handled (a guest's violation, the port's
 * end) is not an error return but an event, VIOLATION or PORT_CLOSED with its reason. Never
 * blocks (io_uring does the waiting); never calls into Python. Not thread-safe: one thread (the
 * loop's) uses a ring. */
#ifndef SBX_NET_RELAY_H
#define SBX_NET_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "net_protocol.h"
#include "sbx_err.h"

/* Host -> guest bytes queued on one port beyond which the guest counts as not reading it (DATA is
 * already bounded by the windows; the rest is control frames). Over it, the relay fails. */
#define SBX_NET_RELAY_OUT_MAX ((size_t)SBX_NET_STREAMS_MAX * (SBX_NET_WINDOW + 4096u) + (1u << 20))

enum sbx_net_event_kind {
	SBX_NET_EV_OPEN = 1,        /* stream, port, name: answer with sbx_net_open_reply */
	SBX_NET_EV_CONNECTED = 2,   /* stream, status: the guest's answer to sbx_net_connect */
	SBX_NET_EV_CLOSED = 3,      /* stream, bytes_to_guest, bytes_from_guest, reset */
	SBX_NET_EV_VIOLATION = 4,   /* reason: the relay is dead, kill the VM */
	SBX_NET_EV_PORT_CLOSED = 5, /* the port reached end of file or failed: the relay is dead */
	SBX_NET_EV_REFUSED = 6,     /* stream, port, name, status: an OPEN the relay refused itself
				     * (SBX_NET_TOO_MANY: host streams fill the table); already
				     * answered, the stream never existed: for the log only */
	SBX_NET_EV_GUEST_REFUSED = 7, /* port, status (enum sbx_net_refusal), count, text (the
				       * subject): an attempt the guest refused itself and reported
				       * (NET_REFUSED), for the log only; stream 0 */
};

/* Per relay, NET_REFUSED reports turned into events: a burst of this many, then this many a
 * second; the rest is counted and reported as one REFUSAL_DROPPED event. */
#define SBX_NET_RELAY_REFUSALS_BURST 64u
#define SBX_NET_RELAY_REFUSALS_PER_SECOND 16u

struct sbx_net_event {
	enum sbx_net_event_kind kind;
	uint32_t relay;
	uint32_t stream;
	uint32_t port;   /* OPEN, REFUSED */
	uint32_t status; /* CONNECTED, REFUSED: enum sbx_net_status; CLOSED: 1 if reset, 0 if done;
			  * GUEST_REFUSED: enum sbx_net_refusal */
	uint64_t count;  /* GUEST_REFUSED: the attempts it stands for */
	uint64_t bytes_to_guest;
	uint64_t bytes_from_guest;
	char text[SBX_NET_NAME_MAX + 1]; /* OPEN, REFUSED: the name; GUEST_REFUSED: the subject;
					  * VIOLATION: why (NUL-terminated) */
};

struct sbx_net_ring;

/* A ring with room for `entries` submissions, its eventfd registered. -ENOMEM, or a failed call's
 * error (io_uring_queue_init: -ENOSYS, -EPERM when io_uring is disabled). */
int sbx_net_ring_new(unsigned entries, struct sbx_net_ring **out, struct sbx_err *err);
/* Close every socket and port and free everything (pending operations are cancelled by the
 * kernel when the ring goes). NULL is fine. */
void sbx_net_ring_free(struct sbx_net_ring *r);
/* Readable when completions are waiting: the fd to give the event loop. */
int sbx_net_ring_fd(const struct sbx_net_ring *r);
/* Handle every completion that is ready, submit what follows from them, queue the events. 0, or
 * -errno: a failed read of the eventfd or io_uring_submit, or -ENOMEM (sticky) once an event
 * could not be queued. The events queued before a failure are still there to take. */
int sbx_net_ring_run(struct sbx_net_ring *r, struct sbx_err *err);
/* 1 and *ev filled, or 0 when no event is queued. */
int sbx_net_ring_next_event(struct sbx_net_ring *r, struct sbx_net_event *ev);
/* Streams and relays alive or still waiting for their operations to end (tests use it to check
 * that teardown completes). */
size_t sbx_net_ring_live(const struct sbx_net_ring *r);

/* Start relaying on port_fd (a stream socket or character device; ownership passes to the ring
 * on success, the caller keeps it on failure). *relay gets a non-zero id. -ENOMEM, -EBUSY (the
 * submission queue is full). */
int sbx_net_relay_add(struct sbx_net_ring *r, int port_fd, uint32_t *relay, struct sbx_err *err);
/* Reset every stream of the relay and forget it (its memory goes once the kernel has finished
 * with its buffers). -ENOENT for an unknown relay. */
int sbx_net_relay_close(struct sbx_net_ring *r, uint32_t relay, struct sbx_err *err);

/* Answer an OPEN event. status SBX_NET_OK: sock_fd is the connected TCP socket for the stream;
 * otherwise sock_fd is -1 and reason (<= SBX_NET_MESSAGE_MAX bytes) says why. sock_fd is owned by
 * the call in every case (closed on failure). -ENOENT when the stream has gone meanwhile (the
 * guest closed it, or its relay died), -EINVAL for a bad argument. */
int sbx_net_open_reply(struct sbx_net_ring *r, uint32_t relay, uint32_t stream, uint32_t status,
		       const char *reason, size_t reason_len, int sock_fd, struct sbx_err *err);
/* Open a host stream to 127.0.0.1:guest_port inside the guest for sock_fd (an accepted client;
 * owned by the call in every case). *stream gets its id; a CONNECTED event follows. -EINVAL (no
 * socket, a port outside 1..65535), -ENOENT for a dead relay, -EBUSY when the relay has
 * SBX_NET_STREAMS_MAX streams, -ENOMEM. */
int sbx_net_connect(struct sbx_net_ring *r, uint32_t relay, uint32_t guest_port, int sock_fd,
		    uint32_t *stream, struct sbx_err *err);

/* Tests and the fuzzer: handle n bytes (<= one maximal frame with its header) as if the port had
 * given them. 0, -ENOENT (an unknown relay), -EINVAL (more bytes). A violation is an event, as
 * for bytes from the port. */
int sbx_net_relay_ingest(struct sbx_net_ring *r, uint32_t relay, const void *data, size_t n,
			 struct sbx_err *err);

#endif /* SBX_NET_RELAY_H */
