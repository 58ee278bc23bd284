/* Volumes: see volumes.h. What the host attached is found by serial ("sbx-disk-<kind>"); what
 * it is for comes from the kernel command line (volume_args.h). The host never reads a volume:
 * everything on it was written by guests, so it is mounted nosuid,nodev and never trusted to
 * hold more than files (the kernel's ext4 parser is the guest's own attack surface).
 */
#include "volumes.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/fs.h>

#include "agent.h"
#include "cleanup.h"

#define MKE2FS "/sbin/mke2fs"
#define NOSUID_NODEV (MS_NOSUID | MS_NODEV)
/* Upper layers of the overlays that make mount points on the read-only image (make_dirs). */
#define OVERLAYS_DIR SBX_VOLUMES_DIR "/.overlays"
/* A journal commit count that could not be read (sbx_volumes_settle). */
#define UNKNOWN_COMMITS ULLONG_MAX

static struct sbx_volume_arg vols[SBX_VOLUMES_MAX];
/* Each volume's block device name ("vdc"), and its journal's commit count after the last
 * checkpoint (sbx_volumes_settle). */
static char devs[SBX_VOLUMES_MAX][64];
static unsigned long long settled_commits[SBX_VOLUMES_MAX];
static size_t nvols;     /* parsed */
static size_t nmounted;  /* vols[0..nmounted) are mounted and bound */
static unsigned noverlays;
static char error[256];

const char *sbx_volumes_error(void)
{
	return error[0] ? error : NULL;
}

size_t sbx_volumes_count(void)
{
	return nmounted;
}

const struct sbx_volume_arg *sbx_volume_at(size_t i)
{
	return i < nmounted ? &vols[i] : NULL;
}

int sbx_volume_source(size_t i, char *buf, size_t size)
{
	int n = snprintf(buf, size, SBX_VOLUMES_DIR "/%s", vols[i].kind);
	return n > 0 && (size_t)n < size ? 0 : -ENAMETOOLONG;
}

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
	char msg[sizeof(error)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sbx_log("volumes: %s", msg);
	if (!error[0])
		snprintf(error, sizeof(error), "%s", msg);
}

/* 1: an ext4 superblock (*recover: its journal is marked for replay, as every VM that had it
 * read-write and was killed leaves it); 0: a fresh volume (its superblock's block all zeros,
 * as the host created it); -EUCLEAN: something else, left as it is; -errno. */
static int probe(const char *dev, bool *recover)
{
	_cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	uint8_t block[1024];
	ssize_t n = pread(fd, block, sizeof(block), SBX_EXT4_SUPER);
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(block))
		return -EUCLEAN;
	if ((unsigned)(block[56] | block[57] << 8) == SBX_EXT4_MAGIC) {
		/* s_feature_incompat (offset 0x60), EXT4_FEATURE_INCOMPAT_RECOVER (0x4). */
		*recover = (block[0x60] & 0x4) != 0;
		return 1;
	}
	for (size_t i = 0; i < sizeof(block); i++)
		if (block[i])
			return -EUCLEAN;
	return 0;
}

/* ext4 with its journal (a volume outlives VMs that are killed mid-write), no reserved blocks,
 * its root owned by the sandbox user; lazy init: a sparse volume reads zeros anyway. */
static int format(const char *dev)
{
	/* execve takes char *: writable copies of the words. */
	char bin[] = MKE2FS, q[] = "-q", force[] = "-F", t[] = "-t", ext4[] = "ext4", m[] = "-m",
	     zero[] = "0", e[] = "-E", path[] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
	char opts[96], device[64];
	snprintf(opts, sizeof(opts), "lazy_itable_init=1,lazy_journal_init=1,root_owner=%d:%d",
		 SBX_USER_UID, SBX_USER_GID);
	snprintf(device, sizeof(device), "%s", dev);
	char *const argv[] = {bin, q, force, t, ext4, m, zero, e, opts, device, NULL};
	char *const envp[] = {path, NULL};
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execve(MKE2FS, argv, envp);
		_exit(127);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

/* A directory on which the read-only image can take new entries: an overlay of it with an upper
 * layer in RAM (its files stay visible). Never on "/": the host keeps mount paths two deep. */
static int overlay_on(const char *dir)
{
	if (strcmp(dir, "/") == 0 || dir[0] != '/')
		return -EROFS;
	if (noverlays == 0 &&
	    (mkdir(OVERLAYS_DIR, 0700) < 0 ||
	     mount("tmpfs", OVERLAYS_DIR, "tmpfs", NOSUID_NODEV, "mode=0700,size=1m") < 0))
		return -errno;
	char upper[96], work[96], data[384];
	unsigned id = noverlays++;
	snprintf(upper, sizeof(upper), OVERLAYS_DIR "/%u", id);
	if (mkdir(upper, 0755) < 0)
		return -errno;
	snprintf(upper, sizeof(upper), OVERLAYS_DIR "/%u/upper", id);
	snprintf(work, sizeof(work), OVERLAYS_DIR "/%u/work", id);
	if (mkdir(upper, 0755) < 0 || mkdir(work, 0755) < 0)
		return -errno;
	int n = snprintf(data, sizeof(data), "lowerdir=%s,upperdir=%s,workdir=%s", dir, upper, work);
	if (n < 0 || (size_t)n >= sizeof(data))
		return -ENAMETOOLONG;
	if (mount("overlay", dir, "overlay", NOSUID_NODEV, data) < 0)
		return -errno;
	return 0;
}

/* Every directory of path (absolute, checked by volume_args.c), made where missing: owned by
 * root, 0755. An existing component must be a directory, not a symlink (the image's own: no
 * user code ran yet, but a mount must not follow one anywhere). */
static int make_dirs(const char *path)
{
	char prefix[SBX_VOLUME_PATH_MAX + 1];
	size_t len = strlen(path);
	for (size_t i = 1; i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		memcpy(prefix, path, i);
		prefix[i] = '\0';
		struct stat st;
		if (lstat(prefix, &st) == 0) {
			if (!S_ISDIR(st.st_mode))
				return -ENOTDIR;
			continue;
		}
		if (errno != ENOENT)
			return -errno;
		if (mkdir(prefix, 0755) == 0)
			continue;
		if (errno != EROFS)
			return -errno;
		/* The parent is on the read-only image: lay an overlay on it, then make it. */
		char *slash = strrchr(prefix, '/');
		char parent[SBX_VOLUME_PATH_MAX + 1];
		size_t plen = slash == prefix ? 1 : (size_t)(slash - prefix);
		memcpy(parent, prefix, plen);
		parent[plen] = '\0';
		int rc = overlay_on(parent);
		if (rc < 0)
			return rc;
		if (mkdir(prefix, 0755) < 0)
			return -errno;
	}
	return 0;
}

static int mount_fs(const struct sbx_volume_arg *v, const char *dev, const char *target)
{
	bool recover = false;
	int kind = probe(dev, &recover);
	if (kind == -EUCLEAN) {
		set_error("volume at %s holds no ext4 file system: left as it is", v->path);
		return kind;
	}
	if (kind < 0) {
		set_error("volume at %s: reading %s: %s", v->path, dev, strerror(-kind));
		return kind;
	}
	if (kind == 0 && v->read_only) {
		/* Never written: an empty read-only directory, as the volume's content is. */
		if (mount("tmpfs", target, "tmpfs", NOSUID_NODEV | MS_NOEXEC | MS_RDONLY,
			  "mode=0755,size=4k") < 0) {
			int err = errno;
			set_error("volume at %s: empty mount: %s", v->path, strerror(err));
			return -err;
		}
		return 0;
	}
	if (kind == 0) {
		int rc = format(dev);
		if (rc < 0) {
			set_error("volume at %s: formatting %s failed", v->path, dev);
			return rc;
		}
		sbx_log("volumes: formatted %s (ext4) for %s", dev, v->path);
	}
	unsigned long flags = NOSUID_NODEV | (v->read_only ? MS_RDONLY : 0);
	/* A killed writer leaves its journal marked for replay, which a read-only disk cannot
	 * take: read the file system as its last checkpoint left it. The writer's agent
	 * checkpoints before every EXIT (sbx_volumes_settle), so that is all its execs wrote. */
	const char *data = v->read_only && recover ? "noload" : NULL;
	if (mount(dev, target, "ext4", flags, data) == 0)
		return 0;
	int err = errno;
	set_error("volume at %s: mounting %s: %s", v->path, dev, strerror(err));
	return -err;
}

static int setup_one(size_t i)
{
	const struct sbx_volume_arg *v = &vols[i];
	char dev[64], source[64];
	int rc = sbx_find_disk(v->kind, dev, sizeof(dev));
	if (rc < 0) {
		set_error("volume at %s: no disk %s%s: %s", v->path, SBX_DISK_SERIAL_PREFIX, v->kind,
			  strerror(-rc));
		return rc;
	}
	if ((rc = sbx_volume_source(i, source, sizeof(source))) < 0)
		return rc;
	snprintf(devs[i], sizeof(devs[i]), "%s", dev + strlen("/dev/"));
	settled_commits[i] = UNKNOWN_COMMITS; /* the first settle checkpoints */
	if (mkdir(source, 0755) < 0 && errno != EEXIST) {
		int err = errno;
		set_error("volume at %s: mkdir %s: %s", v->path, source, strerror(err));
		return -err;
	}
	if ((rc = mount_fs(v, dev, source)) < 0)
		return rc;
	if ((rc = make_dirs(v->path)) < 0) {
		set_error("volume at %s: making its mount point: %s%s", v->path, strerror(-rc),
			  rc == -EROFS ? " (use a directory under /mnt, /opt, /srv or /home/user)" : "");
		return rc;
	}
	if (mount(source, v->path, NULL, MS_BIND, NULL) < 0) {
		int err = errno;
		set_error("volume at %s: bind: %s", v->path, strerror(err));
		return -err;
	}
	if (v->read_only &&
	    mount(NULL, v->path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | NOSUID_NODEV, NULL) < 0)
		sbx_log("volumes: remount %s read-only: %s", v->path, strerror(errno));
	return 0;
}

void sbx_volumes_setup(void)
{
	char buf[4096];
	ssize_t n;
	{
		_cleanup_close_ int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			set_error("/proc/cmdline: %s", strerror(errno));
			return;
		}
		n = read(fd, buf, sizeof(buf));
	}
	if (n < 0) {
		set_error("/proc/cmdline: %s", strerror(errno));
		return;
	}
	char why[160];
	int count = sbx_volume_args_parse(buf, (size_t)n, vols, SBX_VOLUMES_MAX, why, sizeof(why));
	if (count < 0) {
		set_error("%s", why);
		return;
	}
	nvols = (size_t)count;
	if (nvols == 0)
		return;
	if (mkdir(SBX_VOLUMES_DIR, 0700) < 0 && errno != EEXIST) {
		set_error("mkdir " SBX_VOLUMES_DIR ": %s", strerror(errno));
		return;
	}
	/* In order, stopping at the first failure: runs are refused anyway (the error says why). */
	for (size_t i = 0; i < nvols; i++) {
		if (setup_one(i) < 0)
			return;
		nmounted = i + 1;
		sbx_log("volumes: %s at %s (%s)", vols[i].kind, vols[i].path,
			vols[i].read_only ? "read-only" : "read-write");
	}
}

/* The journal's committed transactions so far: the first number of jbd2's info file (its own
 * count), or UNKNOWN_COMMITS when it cannot be read (the caller then checkpoints anyway). */
static unsigned long long journal_commits(size_t i)
{
	char path[96], buf[256];
	snprintf(path, sizeof(path), "/proc/fs/jbd2/%s-8/info", devs[i]);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return UNKNOWN_COMMITS;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	if (n <= 0)
		return UNKNOWN_COMMITS;
	buf[n] = '\0';
	char *end;
	unsigned long long v = strtoull(buf, &end, 10);
	return end == buf || v == UNKNOWN_COMMITS ? UNKNOWN_COMMITS : v;
}

void sbx_volumes_settle(void)
{
	for (size_t i = 0; i < nmounted; i++) {
		if (vols[i].read_only)
			continue;
		char source[64];
		if (sbx_volume_source(i, source, sizeof(source)) < 0)
			continue;
		_cleanup_close_ int fd = open(source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0) {
			sbx_log("volumes: settle %s: %s", vols[i].path, strerror(errno));
			continue;
		}
		/* Dirty pages written and the journal committed: cheap on a clean file system (no
		 * transaction to commit, no flush). Only when that committed something is the journal
		 * also checkpointed (a freeze: it writes the superblock with FUA, a host fdatasync),
		 * so an exec that wrote nothing to a volume pays next to nothing. */
		if (syncfs(fd) < 0)
			sbx_log("volumes: syncfs %s: %s", vols[i].path, strerror(errno));
		unsigned long long commits = journal_commits(i);
		if (commits != UNKNOWN_COMMITS && commits == settled_commits[i])
			continue;
		if (ioctl(fd, FIFREEZE, 0) < 0) {
			sbx_log("volumes: freeze %s: %s", vols[i].path, strerror(errno));
			continue;
		}
		if (ioctl(fd, FITHAW, 0) < 0)
			sbx_log("volumes: thaw %s: %s", vols[i].path, strerror(errno));
		settled_commits[i] = journal_commits(i);
	}
}
