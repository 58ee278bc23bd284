/* Host channel transport: see agent_channel_guest.h. */
#include "agent_channel_guest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "cleanup.h"
#include "volumes.h"

#define VPORT_CLASS_DIR "/sys/class/virtio-ports"
#define BACKOFF_MIN_MS 50u
#define BACKOFF_MAX_MS 1000u
#define READ_CHUNK (64u * 1024u)
/* What the send queue keeps allocated once drained. */
#define SBX_CHANNEL_KEEP_CAP (256u * 1024u)

/* --- finding the port ------------------------------------------------------------------------ */

/* Read a small sysfs attribute into buf (NUL-terminated, trailing newline removed). */
static int read_attr(const char *path, char *buf, size_t size)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, size - 1);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	if (n > 0 && buf[n - 1] == '\n')
		buf[n - 1] = '\0';
	return 0;
}

/* One scan of the virtio-ports class. 0 and *fd_out on success, -ENOENT if not there (yet). */
static int scan_ports(const char *name, int *fd_out)
{
	DIR *dir = opendir(VPORT_CLASS_DIR);
	if (!dir)
		return -ENOENT;
	int rc = -ENOENT;
	struct dirent *de;
	while ((de = readdir(dir)) != NULL) {
		/* Names are kernel-made ("vport0p1"); still refuse anything that could escape /dev. */
		if (de->d_name[0] == '.' || strchr(de->d_name, '/') || strlen(de->d_name) > 64)
			continue;
		char path[sizeof(VPORT_CLASS_DIR) + sizeof(de->d_name) + 8], port_name[256];
		snprintf(path, sizeof(path), VPORT_CLASS_DIR "/%s/name", de->d_name);
		if (read_attr(path, port_name, sizeof(port_name)) < 0 || strcmp(port_name, name) != 0)
			continue;
		snprintf(path, sizeof(path), "/dev/%s", de->d_name);
		int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
		if (fd < 0) {
			/* The class entry can precede the device node by a moment: retry later. */
			rc = errno == ENOENT ? -ENOENT : -errno;
			break;
		}
		*fd_out = fd;
		rc = 0;
		break;
	}
	closedir(dir);
	return rc;
}

int sbx_channel_find_port(const char *name, unsigned timeout_ms, int *fd_out)
{
	uint64_t deadline = sbx_now_ns() + (uint64_t)timeout_ms * 1000000u;
	int rc;
	for (;;) {
		rc = scan_ports(name, fd_out);
		if (rc == 0 || sbx_now_ns() >= deadline)
			return rc;
		/* Device probing runs in parallel with init; 10 ms keeps boot latency low. */
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

/* --- state ----------------------------------------------------------------------------------- */

int sbx_channel_init(struct sbx_channel *ch, int fd, bool exit_on_hangup, bool enable_sigio)
{
	memset(ch, 0, sizeof(*ch));
	ch->fd = fd;
	ch->exit_on_hangup = exit_on_hangup;
	ch->backoff_ms = BACKOFF_MIN_MS;
	ch->retry_at_ns = 0; /* probe at once */
	sbx_reader_init(&ch->reader, SBX_HOST_FRAME_MAX);
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0)
		return -errno;
	flags |= O_NONBLOCK;
	if (enable_sigio) {
		/* virtio_console raises SIGIO when the host end opens: no need to wait a back-off. */
		if (fcntl(fd, F_SETOWN, getpid()) < 0)
			sbx_log("channel F_SETOWN: %s", strerror(errno));
		else
			flags |= O_ASYNC;
	}
	if (fcntl(fd, F_SETFL, flags) < 0)
		return -errno;
	return 0;
}

void sbx_channel_free(struct sbx_channel *ch)
{
	sbx_close_fd(&ch->fd);
	sbx_reader_free(&ch->reader);
	sbx_buf_free(&ch->out);
	ch->out_off = 0;
}

size_t sbx_channel_pending(const struct sbx_channel *ch)
{
	return ch->out.len - ch->out_off;
}

bool sbx_channel_wants_output(const struct sbx_channel *ch)
{
	return sbx_channel_pending(ch) < SBX_CHANNEL_HIGH_WATER;
}

static void reset_stream(struct sbx_channel *ch)
{
	sbx_reader_free(&ch->reader);
	sbx_reader_init(&ch->reader, SBX_HOST_FRAME_MAX);
	ch->reader_broken = false;
	ch->out.len = 0;
	ch->out_off = 0;
	ch->write_error = 0;
}

/* --- writing --------------------------------------------------------------------------------- */

/* Write what the fd takes now. Errors are remembered, not acted upon: this runs inside frame
 * handlers, where tearing down the reader would pull the frame out from under them. */
static void flush(struct sbx_channel *ch)
{
	while (ch->connected && !ch->write_error && ch->out_off < ch->out.len) {
		ssize_t n = write(ch->fd, ch->out.data + ch->out_off, ch->out.len - ch->out_off);
		if (n > 0) {
			ch->out_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		ch->write_error = n < 0 ? errno : EIO;
	}
	if (ch->out_off == ch->out.len) {
		ch->out.len = 0;
		ch->out_off = 0;
		/* A rich output queues up to 4 MiB at once: once it has gone, give the memory back
		 * (the VM may have 128 MiB in all); the usual frames fit in much less. */
		if (ch->out.cap > SBX_CHANNEL_KEEP_CAP)
			sbx_buf_free(&ch->out);
	} else if (ch->out_off >= 64u * 1024u) {
		/* Compact now and then, not per write: memmove of a long queue is not free. */
		sbx_buf_consume(&ch->out, ch->out_off);
		ch->out_off = 0;
	}
}

int sbx_channel_send(struct sbx_channel *ch, uint8_t type, uint32_t id, const void *payload,
		     size_t len)
{
	if (!ch->connected)
		return -ENOTCONN;
	size_t start;
	int rc = sbx_frame_begin(&ch->out, type, id, &start);
	if (rc == 0)
		rc = sbx_buf_append(&ch->out, payload, len);
	if (rc == 0)
		rc = sbx_frame_end(&ch->out, start, SBX_GUEST_FRAME_MAX);
	else
		ch->out.len = start; /* never leave half a frame in the queue */
	if (rc == 0)
		flush(ch);
	return rc;
}

int sbx_channel_send_error(struct sbx_channel *ch, uint32_t id, uint32_t code, const char *fmt,
			   ...)
{
	char msg[SBX_ERROR_MESSAGE_MAX + 1];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	size_t len = n < 0 ? 0 : (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1;
	struct sbx_buf b = {0};
	int rc = sbx_put_u32(&b, code);
	if (rc == 0)
		rc = sbx_put_str(&b, msg, len);
	if (rc == 0)
		rc = sbx_channel_send(ch, SBX_MSG_ERROR, id, b.data, b.len);
	sbx_buf_free(&b);
	return rc;
}

int sbx_channel_send_exit(struct sbx_channel *ch, uint32_t id, const struct sbx_exit *e)
{
	if (!ch->connected)
		return -ENOTCONN;
	/* What the exec wrote to volumes is on their disks before its result is out. */
	sbx_volumes_settle();
	int rc = sbx_encode_exit(&ch->out, id, e);
	if (rc == 0)
		flush(ch);
	return rc;
}

static int send_ready(struct sbx_channel *ch)
{
	struct sbx_buf b = {0};
	static const char version[] = "sbx-agent " SBX_AGENT_VERSION;
	int rc = sbx_put_u32(&b, SBX_PROTOCOL_VERSION);
	if (rc == 0)
		rc = sbx_put_str(&b, version, sizeof(version) - 1);
	if (rc == 0)
		rc = sbx_channel_send(ch, SBX_MSG_READY, 0, b.data, b.len);
	sbx_buf_free(&b);
	return rc;
}

/* --- connection state and reading -------------------------------------------------------------- */

static void schedule_probe(struct sbx_channel *ch)
{
	ch->retry_at_ns = sbx_now_ns() + (uint64_t)ch->backoff_ms * 1000000u;
	ch->backoff_ms = ch->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ch->backoff_ms * 2;
}

static int disconnect(struct sbx_channel *ch, const char *why)
{
	if (ch->exit_on_hangup)
		return SBX_CHAN_HANGUP;
	sbx_log("host disconnected (%s); waiting for it", why);
	ch->connected = false;
	/* Queued frames were for the host that left; a new one starts with READY. */
	reset_stream(ch);
	ch->backoff_ms = BACKOFF_MIN_MS;
	schedule_probe(ch);
	return SBX_CHAN_DISCONNECTED;
}

void sbx_channel_wake(struct sbx_channel *ch)
{
	if (!ch->connected)
		ch->retry_at_ns = 0;
}

int sbx_channel_poll_events(struct sbx_channel *ch, uint64_t now_ns, int *timeout_ms)
{
	if (!ch->connected) {
		if (now_ns < ch->retry_at_ns) {
			uint64_t ms = (ch->retry_at_ns - now_ns + 999999u) / 1000000u;
			if (*timeout_ms < 0 || (uint64_t)*timeout_ms > ms)
				*timeout_ms = (int)ms;
			return -1;
		}
		/* A connected port is writable at once; a closed one reports POLLHUP at once. */
		return POLLIN | POLLOUT;
	}
	if (ch->write_error) {
		*timeout_ms = 0; /* let sbx_channel_handle act on it now */
		return 0;
	}
	int ev = 0;
	if (!ch->reader_broken && sbx_channel_wants_output(ch))
		ev |= POLLIN;
	if (sbx_channel_pending(ch))
		ev |= POLLOUT;
	return ev;
}

/* Feed bytes to the reader and hand out every complete frame. */
static void consume(struct sbx_channel *ch, const uint8_t *data, size_t n, sbx_frame_fn fn,
		    void *ctx)
{
	int rc = sbx_reader_feed(&ch->reader, data, n);
	struct sbx_frame f;
	while (rc == 0 && (rc = sbx_reader_next(&ch->reader, &f)) == 1) {
		fn(ctx, &f);
		rc = 0;
	}
	if (rc < 0) {
		/* The frame boundaries are lost: nothing after this can be trusted. A reconnect (new host
		 * process) starts a fresh reader. */
		sbx_log("malformed frame from host (%s); no longer reading the channel",
			strerror(-rc));
		sbx_channel_send_error(ch, 0, SBX_ERR_BAD_REQUEST,
				       "malformed frame (%s): stream out of sync, agent stopped reading",
				       strerror(-rc));
		ch->reader_broken = true;
	}
}

int sbx_channel_handle(struct sbx_channel *ch, short revents, sbx_frame_fn fn, void *ctx)
{
	int event = SBX_CHAN_NONE;
	if (!ch->connected) {
		if (revents & (POLLHUP | POLLERR | POLLNVAL)) {
			if (ch->exit_on_hangup)
				return SBX_CHAN_HANGUP;
			schedule_probe(ch);
			return SBX_CHAN_NONE;
		}
		if (!(revents & (POLLIN | POLLOUT)))
			return SBX_CHAN_NONE;
		ch->connected = true;
		ch->backoff_ms = BACKOFF_MIN_MS;
		reset_stream(ch);
		sbx_log("host connected");
		send_ready(ch);
		event = SBX_CHAN_CONNECTED;
	}
	if (ch->write_error)
		return disconnect(ch, strerror(ch->write_error));
	if (revents & POLLOUT)
		flush(ch);
	if (ch->write_error)
		return disconnect(ch, strerror(ch->write_error));
	bool hup = revents & (POLLHUP | POLLERR | POLLNVAL);
	if (!(revents & POLLIN) && !hup)
		return event;
	if (ch->reader_broken && !hup)
		return event;
	static uint8_t buf[READ_CHUNK];
	ssize_t n = read(ch->fd, buf, sizeof(buf));
	if (n > 0) {
		if (!ch->reader_broken)
			consume(ch, buf, (size_t)n, fn, ctx);
	} else if (n == 0) {
		return disconnect(ch, "end of stream");
	} else if (errno == EAGAIN || errno == EINTR) {
		if (hup)
			return disconnect(ch, "hangup");
	} else {
		return disconnect(ch, strerror(errno));
	}
	/* A handler may have hit a write error; act on it next round (poll timeout 0). */
	return event;
}
