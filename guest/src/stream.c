/* Output streams and phase timers: see stream.h. */
#include "stream.h"

#include <errno.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "cleanup.h"

void sbx_timer_arm(int timer_fd, uint64_t ms)
{
	struct itimerspec its;
	memset(&its, 0, sizeof(its));
	its.it_value.tv_sec = (time_t)(ms / 1000u);
	its.it_value.tv_nsec = (long)(ms % 1000u) * 1000000L;
	if (timerfd_settime(timer_fd, 0, &its, NULL) < 0)
		sbx_log("timerfd_settime: %s", strerror(errno));
}

bool sbx_stream_forward(struct sbx_stream *s, struct sbx_channel *ch, uint32_t id, bool silent,
			const uint8_t *data, size_t n)
{
	uint64_t room = s->total < s->limit ? s->limit - s->total : 0;
	size_t send = n < room ? n : (size_t)room;
	if (send > 0 && !silent) {
		int rc = sbx_channel_send(ch, s->msg_type, id, data, send);
		if (rc < 0 && rc != -ENOTCONN)
			sbx_log("sending output: %s", strerror(-rc));
	}
	s->total += n;
	return n > room;
}

long sbx_stream_read(struct sbx_stream *s, uint8_t *buf, size_t size)
{
	if (s->fd < 0)
		return -1;
	ssize_t n = read(s->fd, buf, size);
	if (n > 0)
		return (long)n;
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n < 0)
		sbx_log("reading output pipe: %s", strerror(errno));
	sbx_close_fd(&s->fd);
	return -1;
}
