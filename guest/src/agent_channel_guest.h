/* The host channel: one virtio-serial port (a socket in test mode) carrying protocol.h frames.
 *
 * Writes are non-blocking and queued, so that a slow or absent host never stalls the event loop
 * (timeouts are still enforced while the host is not reading). The queue has a high-water mark
 * above which the loop stops reading the user's pipes and the channel: that is the back-pressure.
 *
 * Connection state: a virtio-serial port whose host end is closed reports POLLHUP and read() == 0
 * without end, so while disconnected the fd is left out of poll() and probed again after a
 * back-off (50 ms doubling to 1 s), or at once on SIGIO, which the port raises when the host end
 * opens. Each time the host (re)connects the agent sends READY and starts a fresh frame reader.
 */
#ifndef SBX_AGENT_CHANNEL_GUEST_H
#define SBX_AGENT_CHANNEL_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"

/* Above this many queued bytes the event loop stops producing output. */
#define SBX_CHANNEL_HIGH_WATER (256u * 1024u)

enum sbx_channel_event {
	SBX_CHAN_NONE = 0,
	SBX_CHAN_CONNECTED,    /* host end opened: READY was queued */
	SBX_CHAN_DISCONNECTED, /* host end closed: queued output dropped, will probe again */
	SBX_CHAN_HANGUP,       /* test mode: peer closed, the agent should exit */
};

struct sbx_channel {
	int fd;
	bool exit_on_hangup; /* test mode: a closed socket never comes back */
	bool connected;
	bool reader_broken; /* the host sent bytes that broke framing: stop reading */
	int write_error;    /* set by a failed write, acted upon in sbx_channel_handle */
	unsigned backoff_ms;
	uint64_t retry_at_ns;
	struct sbx_reader reader;
	struct sbx_buf out;
	size_t out_off; /* bytes of out already written */
};

typedef void (*sbx_frame_fn)(void *ctx, const struct sbx_frame *f);

/* Find the virtio-serial port named `name` and open it, polling for up to timeout_ms. */
int sbx_channel_find_port(const char *name, unsigned timeout_ms, int *fd_out);

/* Takes ownership of fd (made non-blocking). enable_sigio: ask for SIGIO on host open. */
int sbx_channel_init(struct sbx_channel *ch, int fd, bool exit_on_hangup, bool enable_sigio);
void sbx_channel_free(struct sbx_channel *ch);

/* Frames. All queue and try to write at once; while disconnected they are dropped (-ENOTCONN). */
int sbx_channel_send(struct sbx_channel *ch, uint8_t type, uint32_t id, const void *payload,
		     size_t len);
int sbx_channel_send_error(struct sbx_channel *ch, uint32_t id, uint32_t code, const char *fmt,
			   ...) __attribute__((format(printf, 4, 5)));
int sbx_channel_send_exit(struct sbx_channel *ch, uint32_t id, const struct sbx_exit *e);

size_t sbx_channel_pending(const struct sbx_channel *ch);
/* Whether a producer of output should read more now (queue below the high-water mark). */
bool sbx_channel_wants_output(const struct sbx_channel *ch);

/* Poll integration. events: what to wait for, or -1 to leave the fd out of this poll() (then
 * *timeout_ms is lowered to when it should be probed again). */
int sbx_channel_poll_events(struct sbx_channel *ch, uint64_t now_ns, int *timeout_ms);
/* Act on revents; each complete frame goes to fn. Returns an enum sbx_channel_event. */
int sbx_channel_handle(struct sbx_channel *ch, short revents, sbx_frame_fn fn, void *ctx);
/* SIGIO arrived: probe at once if waiting for the host. */
void sbx_channel_wake(struct sbx_channel *ch);

#endif /* SBX_AGENT_CHANNEL_GUEST_H */
