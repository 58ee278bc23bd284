/* Host end of the agent channel: see agent_channel.h. */
#define _GNU_SOURCE 1
#include "agent_channel.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void sbx_channel_init(struct sbx_channel *ch, int fd)
{
	ch->fd = fd;
	ch->eof = 0;
	ch->error = 0;
	ch->error_frame_type = -1;
	sbx_reader_init(&ch->in, SBX_GUEST_FRAME_MAX);
	memset(&ch->out, 0, sizeof(ch->out));
	ch->out_off = 0;
}

void sbx_channel_destroy(struct sbx_channel *ch)
{
	int fd = ch->fd;
	ch->fd = -1;
	if (fd >= 0)
		close(fd);
	sbx_reader_free(&ch->in);
	sbx_buf_free(&ch->out);
	ch->out_off = 0;
}

int sbx_channel_take_fd(struct sbx_channel *ch)
{
	int fd = ch->fd;
	ch->fd = -1;
	return fd;
}

int sbx_channel_ingest(struct sbx_channel *ch, const void *data, size_t n)
{
	if (ch->error)
		return ch->error;
	int rc = sbx_reader_feed(&ch->in, data, n);
	if (rc == -EPROTO || rc == -EMSGSIZE)
		ch->error = rc;
	return rc;
}

ssize_t sbx_channel_read(struct sbx_channel *ch, size_t max, struct sbx_err *err)
{
	if (ch->error) /* the guest broke the protocol: reported by sbx_channel_next_event */
		return sbx_err_set(err, ch->error, "the guest broke the protocol");
	if (ch->fd < 0)
		return sbx_err_sys(err, -EBADF, "recv");
	if (ch->eof)
		return 0;
	if (max > sizeof(ch->scratch))
		max = sizeof(ch->scratch);
	if (max == 0)
		return 0;
	ssize_t n;
	do
		n = recv(ch->fd, ch->scratch, max, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		if (errno == ECONNRESET) {
			ch->eof = 1;
			return 0;
		}
		return sbx_err_sys(err, -errno, "recv");
	}
	if (n == 0) {
		ch->eof = 1;
		return 0;
	}
	int rc = sbx_channel_ingest(ch, ch->scratch, (size_t)n);
	if (rc == -ENOMEM)
		return sbx_err_set(err, rc, "out of memory");
	if (rc < 0)
		return sbx_err_set(err, rc, "the guest broke the protocol");
	return n;
}

int sbx_channel_next_event(struct sbx_channel *ch, struct sbx_event *ev)
{
	struct sbx_frame f;
	if (ch->error)
		return ch->error;
	int rc = sbx_reader_next(&ch->in, &f);
	if (rc <= 0) {
		if (rc < 0)
			ch->error = rc;
		return rc;
	}
	rc = sbx_event_decode(&f, ev);
	if (rc < 0) {
		ch->error_frame_type = f.type;
		return ch->error = (rc == -EMSGSIZE ? -EMSGSIZE : -EPROTO);
	}
	return 1;
}

void sbx_channel_error(const struct sbx_channel *ch, struct sbx_err *err)
{
	int t = ch->error_frame_type;
	if (!ch->error)
		sbx_err_clear(err);
	else if (t < 0)
		sbx_err_set(err, ch->error, "%s",
			    ch->error == -EMSGSIZE ? "guest sent a frame larger than GUEST_FRAME_MAX"
						   : "guest sent a malformed frame header");
	else if ((t >= SBX_MSG_READY && t <= SBX_MSG_FILE_ERROR) || t == SBX_MSG_RESEEDED)
		sbx_err_set(err, ch->error, "guest sent a malformed %s frame%s",
			    sbx_event_kind_name((enum sbx_event_kind)t),
			    ch->error == -EMSGSIZE ? " (a string over its limit)" : "");
	else
		sbx_err_set(err, ch->error, "guest sent a frame of unexpected type %d", t);
}

size_t sbx_channel_pending(const struct sbx_channel *ch)
{
	return ch->out.len - ch->out_off;
}

int sbx_channel_flush(struct sbx_channel *ch, struct sbx_err *e)
{
	while (ch->out_off < ch->out.len) {
		if (ch->fd < 0)
			return sbx_err_sys(e, -EBADF, "send");
		ssize_t n = send(ch->fd, ch->out.data + ch->out_off, ch->out.len - ch->out_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return sbx_err_sys(e, -errno, "send");
		}
		ch->out_off += (size_t)n;
	}
	/* Everything written: reuse the buffer from the start. */
	ch->out.len = 0;
	ch->out_off = 0;
	return 0;
}

/* Make room at the end of the queue: drop what was written before appending more. Returns the
 * queue length a frame appended next starts at. */
static size_t begin_queue(struct sbx_channel *ch)
{
	if (ch->out_off) {
		sbx_buf_consume(&ch->out, ch->out_off);
		ch->out_off = 0;
	}
	return ch->out.len;
}

/* Close what begin_queue opened: rc is the encoder's result. A frame that would push the queue
 * past SBX_CHANNEL_OUT_MAX is taken back (-ENOBUFS): a guest that stops reading must not make
 * the host buffer without bound. Otherwise write what the socket takes now. */
static int commit_queue(struct sbx_channel *ch, size_t before, int rc, struct sbx_err *e)
{
	if (rc < 0)
		return rc;
	if (ch->out.len > SBX_CHANNEL_OUT_MAX) {
		ch->out.len = before;
		return sbx_err_set(e, -ENOBUFS, "too many bytes queued for the guest");
	}
	return sbx_channel_flush(ch, e);
}

int sbx_channel_queue_exec(struct sbx_channel *ch, const struct sbx_exec_req *r, struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_exec(&ch->out, r, e), e);
}

int sbx_channel_queue_ping(struct sbx_channel *ch, uint32_t id, struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_ping(&ch->out, id, e), e);
}

int sbx_channel_queue_reseed(struct sbx_channel *ch, uint32_t id, const uint8_t *seed, size_t n,
			     uint64_t realtime_ns, struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_reseed(&ch->out, id, seed, n, realtime_ns, e), e);
}

int sbx_channel_queue_prestart(struct sbx_channel *ch, uint32_t id, uint8_t language,
			       struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_prestart(&ch->out, id, language, e), e);
}

int sbx_channel_queue_file(struct sbx_channel *ch, const struct sbx_file_req *r, struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_file_request(&ch->out, r, e), e);
}

int sbx_channel_queue_net_config(struct sbx_channel *ch, const struct sbx_net_config_req *r,
				 struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_net_config(&ch->out, r, e), e);
}

int sbx_channel_queue_tool_result(struct sbx_channel *ch, const struct sbx_tool_result_req *r,
				  struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_tool_result(&ch->out, r, e), e);
}

int sbx_channel_queue_proc(struct sbx_channel *ch, const struct sbx_proc_req *r, struct sbx_err *e)
{
	size_t before = begin_queue(ch);
	return commit_queue(ch, before, sbx_encode_proc_request(&ch->out, r, e), e);
}
