/* File transfer: see files.h. */
#include "files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_request_guest.h"
#include "cleanup.h"
#include "cputag.h"

/* Chunks sent per pump: bounds one loop iteration's work. */
#define PUMP_CHUNKS 8
/* File system accesses with the sandbox user's rights (and ownership of what is created). */
static void as_user(const struct sbx_files *f)
{
	if (f->cfg->drop_privileges) {
		setfsgid(SBX_USER_GID);
		setfsuid(SBX_USER_UID);
	}
}

static void as_root(const struct sbx_files *f)
{
	if (f->cfg->drop_privileges) {
		setfsuid(0);
		setfsgid(0);
	}
}

static uint32_t file_error_kind(int err)
{
	switch (err) {
	case ENOENT:
		return SBX_FILE_ERR_NOT_FOUND;
	case ELOOP:
	case ENOTDIR:
	case EISDIR:
	case EINVAL:
	case EXDEV:
	case ENAMETOOLONG:
		return SBX_FILE_ERR_PATH;
	case EFBIG:
		return SBX_FILE_ERR_TOO_LARGE;
	default:
		return SBX_FILE_ERR_IO;
	}
}

static void send_error(struct sbx_files *f, uint32_t id, uint32_t kind, const char *what, int err)
{
	struct sbx_buf b = {0};
	char msg[SBX_ERROR_MESSAGE_MAX];
	int n = snprintf(msg, sizeof(msg), "%s%s%s", what, err ? ": " : "", err ? strerror(err) : "");
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof(msg))
		n = (int)sizeof(msg) - 1;
	if (sbx_put_u32(&b, kind) == 0 && sbx_put_str(&b, msg, (size_t)n) == 0)
		sbx_channel_send(f->ch, SBX_MSG_FILE_ERROR, id, b.data, b.len);
	sbx_buf_free(&b);
}

static void send_done(struct sbx_files *f, uint32_t id, uint64_t value)
{
	uint8_t p[8];
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(value >> (8 * i));
	sbx_channel_send(f->ch, SBX_MSG_FILE_DONE, id, p, sizeof(p));
}

/* Walk the first n components from the home directory, never following a symlink; with create,
 * make missing directories. Returns an O_PATH directory fd or -errno. */
static int walk(struct sbx_files *f, const struct sbx_path_parts *p, size_t n, bool create)
{
	int fd = open(f->cfg->home_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (size_t i = 0; i < n; i++) {
		int next = openat(fd, p->comp[i], O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0 && errno == ENOENT && create) {
			if (mkdirat(fd, p->comp[i], 0755) < 0 && errno != EEXIST) {
				int e = errno;
				close(fd);
				return -e;
			}
			next = openat(fd, p->comp[i], O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		}
		int e = errno;
		close(fd);
		if (next < 0)
			return -e;
		fd = next;
	}
	return fd;
}

/* The directory of node's startup snapshot (O_PATH) and, in *name, its file name: the host names
 * it by a flag, never by a path. Returns the fd or -errno. */
static int node_snapshot_dir(const struct sbx_files *f, const char **name)
{
	const char *path = f->cfg->node_snapshot;
	const char *slash = strrchr(path, '/');
	char dir[sizeof(f->cfg->node_snapshot)];
	if (!slash || slash == path || slash[1] == '\0')
		return -EINVAL;
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	*name = slash + 1;
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* --- write ---------------------------------------------------------------------------------- */

static void write_cleanup(struct sbx_files *f)
{
	if (f->write_fd >= 0) {
		sbx_close_fd(&f->write_fd);
		as_user(f);
		unlinkat(f->write_dir_fd, f->tmp_name, 0);
		as_root(f);
	}
	sbx_close_fd(&f->write_dir_fd);
}

static void write_fail(struct sbx_files *f, uint32_t kind, const char *what, int err)
{
	send_error(f, f->write_id, kind, what, err);
	write_cleanup(f);
	f->write_failed = true;
}

static void write_begin(struct sbx_files *f, const struct sbx_frame *fr)
{
	static struct sbx_path_parts p;
	static unsigned counter;
	uint8_t mode = 0;
	if (f->writing) /* the host gave up on the previous one without saying so */
		write_cleanup(f);
	f->writing = true;
	f->write_failed = false;
	f->write_id = fr->id;
	f->written = 0;
	f->tag_len = 0;
	int rc = sbx_parse_file_target(fr->payload, fr->payload_len,
				       SBX_FILE_EXECUTABLE | SBX_FILE_NODE_SNAPSHOT, &p, &mode);
	if (rc == -EPROTO) {
		write_fail(f, SBX_FILE_ERR_PROTOCOL, "malformed FILE_WRITE_BEGIN", 0);
		return;
	}
	if (rc < 0) {
		write_fail(f, SBX_FILE_ERR_PATH, "invalid path", 0);
		return;
	}
	f->write_mode = mode;
	f->write_node_snapshot = mode & SBX_FILE_NODE_SNAPSHOT;
	const char *name = f->write_node_snapshot ? NULL : p.comp[p.n - 1];
	snprintf(f->tmp_name, sizeof(f->tmp_name), ".sbx-upload-%u-%u", fr->id, ++counter);
	as_user(f);
	int dir = f->write_node_snapshot ? node_snapshot_dir(f, &name) : walk(f, &p, p.n - 1, true);
	snprintf(f->final_name, sizeof(f->final_name), "%s", name ? name : "");
	if (dir < 0) {
		as_root(f);
		write_fail(f, file_error_kind(-dir), "opening the target directory", -dir);
		return;
	}
	f->write_dir_fd = dir;
	f->write_fd = openat(dir, f->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			     0600);
	int e = errno;
	as_root(f);
	if (f->write_fd < 0)
		write_fail(f, file_error_kind(e), "creating the file", e);
}

static void write_data(struct sbx_files *f, const struct sbx_frame *fr)
{
	if (!f->writing || fr->id != f->write_id) {
		send_error(f, fr->id, SBX_FILE_ERR_PROTOCOL, "FILE_WRITE_DATA without BEGIN", 0);
		return;
	}
	if (f->write_failed)
		return;
	if (f->written + fr->payload_len > SBX_FILE_SIZE_MAX) {
		write_fail(f, SBX_FILE_ERR_TOO_LARGE, "file over the size limit", 0);
		return;
	}
	const uint8_t *d = fr->payload;
	size_t left = fr->payload_len;
	if (f->write_node_snapshot && f->tag_len < SBX_NODE_TAG_SIZE) {
		size_t n = SBX_NODE_TAG_SIZE - f->tag_len < left ? SBX_NODE_TAG_SIZE - f->tag_len
								  : left;
		memcpy(f->tag + f->tag_len, d, n);
		f->tag_len += (uint32_t)n;
		d += n;
		left -= n;
	}
	while (left > 0) {
		ssize_t n = write(f->write_fd, d, left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			write_fail(f, file_error_kind(errno), "writing the file", errno);
			return;
		}
		d += n;
		left -= (size_t)n;
	}
	f->written += fr->payload_len;
}

static void write_end(struct sbx_files *f, const struct sbx_frame *fr)
{
	if (!f->writing || fr->id != f->write_id) {
		send_error(f, fr->id, SBX_FILE_ERR_PROTOCOL, "FILE_WRITE_END without BEGIN", 0);
		return;
	}
	bool commit = fr->payload_len == 1 && fr->payload[0] == 1;
	if (f->write_failed || !commit) {
		write_cleanup(f); /* abort: no reply */
		f->writing = false;
		return;
	}
	if (f->write_node_snapshot) {
		uint8_t own[SBX_NODE_TAG_SIZE];
		if (!sbx_cpu_tag(own) || f->tag_len != SBX_NODE_TAG_SIZE ||
		    memcmp(own, f->tag, SBX_NODE_TAG_SIZE) != 0) {
			/* V8 would abort every node start on it. */
			write_fail(f, SBX_FILE_ERR_REFUSED,
				   "node's startup snapshot was made on another CPU", 0);
			f->writing = false;
			return;
		}
	}
	mode_t mode = (f->write_mode & SBX_FILE_EXECUTABLE) ? 0755 : 0644;
	as_user(f);
	int rc = fchmod(f->write_fd, mode) < 0 ? -errno : 0;
	if (rc == 0 && renameat(f->write_dir_fd, f->tmp_name, f->write_dir_fd, f->final_name) < 0)
		rc = -errno;
	as_root(f);
	if (rc < 0) {
		write_fail(f, file_error_kind(-rc), "moving the file into place", -rc);
	} else {
		sbx_close_fd(&f->write_fd); /* renamed: nothing to unlink */
		sbx_close_fd(&f->write_dir_fd);
		send_done(f, f->write_id, f->written);
	}
	f->writing = false;
}

/* --- read ----------------------------------------------------------------------------------- */

static void read_begin(struct sbx_files *f, const struct sbx_frame *fr)
{
	static struct sbx_path_parts p;
	/* The host serialises its requests: a read still in progress is one it gave up on (its
	 * destination failed, say). Drop it; the host ignores frames of a forgotten id. */
	sbx_close_fd(&f->read_fd);
	uint8_t flags = 0;
	int rc = sbx_parse_file_target(fr->payload, fr->payload_len, SBX_FILE_NODE_SNAPSHOT, &p,
				       &flags);
	if (rc < 0) {
		send_error(f, fr->id, rc == -EPROTO ? SBX_FILE_ERR_PROTOCOL : SBX_FILE_ERR_PATH,
			   "invalid path", 0);
		return;
	}
	bool node_snapshot = flags & SBX_FILE_NODE_SNAPSHOT;
	uint8_t tag[SBX_NODE_TAG_SIZE];
	if (node_snapshot && !sbx_cpu_tag(tag)) {
		send_error(f, fr->id, SBX_FILE_ERR_PATH, "no CPU tag on this machine", 0);
		return;
	}
	const char *name = node_snapshot ? NULL : p.comp[p.n - 1];
	as_user(f);
	_cleanup_close_ int dir = node_snapshot ? node_snapshot_dir(f, &name)
						: walk(f, &p, p.n - 1, false);
	int fd = dir < 0 ? dir : openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	int e = fd == -1 ? errno : -fd;
	as_root(f);
	if (fd < 0) {
		send_error(f, fr->id, file_error_kind(e), "opening the file", e);
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		send_error(f, fr->id, SBX_FILE_ERR_PATH, "not a regular file", 0);
		return;
	}
	if ((uint64_t)st.st_size + (node_snapshot ? SBX_NODE_TAG_SIZE : 0) > SBX_FILE_SIZE_MAX) {
		close(fd);
		send_error(f, fr->id, SBX_FILE_ERR_TOO_LARGE, "file over the size limit", 0);
		return;
	}
	f->read_fd = fd;
	f->read_id = fr->id;
	f->read_sent = 0;
	f->read_tag_first = node_snapshot;
}

bool sbx_files_pumping(const struct sbx_files *f)
{
	return f->read_fd >= 0;
}

void sbx_files_pump(struct sbx_files *f)
{
	static uint8_t buf[SBX_FILE_CHUNK_MAX];
	if (f->read_fd >= 0 && f->read_tag_first && sbx_channel_wants_output(f->ch)) {
		uint8_t tag[SBX_NODE_TAG_SIZE];
		sbx_cpu_tag(tag); /* known: read_begin checked */
		int rc = sbx_channel_send(f->ch, SBX_MSG_FILE_DATA, f->read_id, tag, sizeof(tag));
		if (rc < 0) {
			/* Never the file without its tag in front. */
			sbx_close_fd(&f->read_fd);
			if (rc != -ENOTCONN)
				send_error(f, f->read_id, SBX_FILE_ERR_IO, "sending the CPU tag", -rc);
			return;
		}
		f->read_tag_first = false;
		f->read_sent += sizeof(tag);
	}
	for (int i = 0; i < PUMP_CHUNKS && f->read_fd >= 0 && sbx_channel_wants_output(f->ch); i++) {
		ssize_t n = read(f->read_fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			sbx_close_fd(&f->read_fd);
			send_error(f, f->read_id, SBX_FILE_ERR_IO, "reading the file", e);
		} else if (n == 0) {
			sbx_close_fd(&f->read_fd);
			send_done(f, f->read_id, f->read_sent);
		} else if (f->read_sent + (uint64_t)n > SBX_FILE_SIZE_MAX) {
			/* The file grew while being read. */
			sbx_close_fd(&f->read_fd);
			send_error(f, f->read_id, SBX_FILE_ERR_TOO_LARGE, "file over the size limit",
				   0);
		} else {
			int rc = sbx_channel_send(f->ch, SBX_MSG_FILE_DATA, f->read_id, buf, (size_t)n);
			f->read_sent += (uint64_t)n;
			if (rc == -ENOTCONN)
				sbx_close_fd(&f->read_fd);
		}
	}
}

/* --- list ----------------------------------------------------------------------------------- */

static void list_dir(struct sbx_files *f, const struct sbx_frame *fr)
{
	static struct sbx_path_parts p;
	int rc = sbx_parse_file_path(fr->payload, fr->payload_len, false, true, &p, NULL);
	if (rc < 0) {
		send_error(f, fr->id, rc == -EPROTO ? SBX_FILE_ERR_PROTOCOL : SBX_FILE_ERR_PATH,
			   "invalid path", 0);
		return;
	}
	as_user(f);
	_cleanup_close_ int dir = walk(f, &p, p.n, false);
	int fd = dir < 0 ? dir : openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int e = fd == -1 ? errno : -fd;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (fd >= 0 && !d) {
		e = errno;
		close(fd);
	}
	if (!d) {
		as_root(f);
		send_error(f, fr->id, file_error_kind(e), "opening the directory", e);
		return;
	}
	struct sbx_buf b = {0};
	uint32_t batch = 0, total = 0;
	bool failed = false;
	struct dirent *de;
	while (!failed && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (++total > SBX_LIST_ENTRIES_MAX) {
			send_error(f, fr->id, SBX_FILE_ERR_TOO_LARGE, "too many directory entries", 0);
			failed = true;
			break;
		}
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			memset(&st, 0, sizeof(st)); /* vanished meanwhile: list it as empty */
		if (batch == 0 && sbx_put_u32(&b, 0) < 0)
			failed = true;
		size_t name_len = strlen(de->d_name);
		if (failed || sbx_put_u8(&b, S_ISDIR(st.st_mode) ? 1 : 0) < 0 ||
		    sbx_put_u64(&b, (uint64_t)st.st_size) < 0 ||
		    sbx_put_str(&b, de->d_name, name_len) < 0) {
			send_error(f, fr->id, SBX_FILE_ERR_IO, "out of memory", 0);
			failed = true;
			break;
		}
		if (++batch == SBX_LIST_BATCH_MAX) {
			for (int i = 0; i < 4; i++)
				b.data[i] = (uint8_t)(batch >> (8 * i));
			sbx_channel_send(f->ch, SBX_MSG_FILE_ENTRIES, fr->id, b.data, b.len);
			b.len = 0;
			batch = 0;
		}
	}
	closedir(d);
	as_root(f);
	if (!failed) {
		if (batch > 0) {
			for (int i = 0; i < 4; i++)
				b.data[i] = (uint8_t)(batch >> (8 * i));
			sbx_channel_send(f->ch, SBX_MSG_FILE_ENTRIES, fr->id, b.data, b.len);
		}
		send_done(f, fr->id, total);
	}
	sbx_buf_free(&b);
}

/* --- entry points --------------------------------------------------------------------------- */

void sbx_files_init(struct sbx_files *f, const struct sbx_config *cfg, struct sbx_channel *ch)
{
	memset(f, 0, sizeof(*f));
	f->cfg = cfg;
	f->ch = ch;
	f->write_dir_fd = f->write_fd = f->read_fd = -1;
}

void sbx_files_handle(struct sbx_files *f, const struct sbx_frame *fr)
{
	switch (fr->type) {
	case SBX_MSG_FILE_WRITE_BEGIN:
		write_begin(f, fr);
		break;
	case SBX_MSG_FILE_WRITE_DATA:
		write_data(f, fr);
		break;
	case SBX_MSG_FILE_WRITE_END:
		write_end(f, fr);
		break;
	case SBX_MSG_FILE_READ:
		read_begin(f, fr);
		break;
	case SBX_MSG_FILE_LIST:
		list_dir(f, fr);
		break;
	default:
		send_error(f, fr->id, SBX_FILE_ERR_PROTOCOL, "not a file message", 0);
		break;
	}
}

void sbx_files_abort(struct sbx_files *f)
{
	write_cleanup(f);
	f->writing = false;
	sbx_close_fd(&f->read_fd);
}
