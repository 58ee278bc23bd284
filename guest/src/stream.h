/* What the one-shot runner (runner.c) and the session REPL (repl.c) share: an output pipe
 * forwarded to the host under a byte limit, and the timerfd that drives their phases. */
#ifndef SBX_STREAM_H
#define SBX_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "agent_channel_guest.h"

struct sbx_stream {
	int fd; /* non-blocking read end, -1 once at EOF */
	uint8_t msg_type;
	uint32_t limit_flag;
	uint32_t limit;
	uint64_t total; /* bytes read, including those past the limit */
};

/* Arm a one-shot timerfd to fire in ms milliseconds (0 disarms). Setting it also drops any
 * expiry not yet read, so a stale tick cannot act on the next phase. */
void sbx_timer_arm(int timer_fd, uint64_t ms);

/* Send what fits under the stream's limit as frames of request `id` (nothing when `silent`: the
 * host that asked is gone), and count all n bytes. Returns true when these bytes passed the
 * limit: the caller stops the code its own way. */
bool sbx_stream_forward(struct sbx_stream *s, struct sbx_channel *ch, uint32_t id, bool silent,
			const uint8_t *data, size_t n);

/* One non-blocking read of at most SBX_OUTPUT_CHUNK_MAX bytes into buf. Returns the byte count,
 * 0 when there is nothing right now, or -1 once the pipe is at EOF or broken (fd then closed). */
long sbx_stream_read(struct sbx_stream *s, uint8_t *buf, size_t size);

#endif /* SBX_STREAM_H */
