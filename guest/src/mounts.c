/* Boot-time file systems. The root file system is a read-only EROFS image, so every place that
 * must be writable is a size-capped file system of its own: a full one then hurts only the run
 * that filled it. /home/user and /tmp are on the VM's work disk when the host attached one
 * (workspace.c), else tmpfs like the rest. The image must provide the mount points (/proc /sys
 * /dev /tmp /run /home/user), since nothing can be created on a read-only root.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "workspace.h"

struct mount_spec {
	const char *source;
	const char *target;
	const char *fstype;
	unsigned long flags;
	const char *data;
	bool workspace; /* on the work disk when there is one (only then a tmpfs) */
};

#define NOSUID_NODEV (MS_NOSUID | MS_NODEV)

/* Order matters: /dev/pts and /dev/shm live on /dev. */
static const struct mount_spec mounts[] = {
	/* hidepid=2: uid 1000 sees only its own processes, not the agent. */
	{"proc", "/proc", "proc", NOSUID_NODEV | MS_NOEXEC, "hidepid=2", false},
	/* Read-only: the agent only reads /sys/class/virtio-ports. */
	{"sysfs", "/sys", "sysfs", NOSUID_NODEV | MS_NOEXEC | MS_RDONLY, NULL, false},
	/* Normally mounted by the kernel already (CONFIG_DEVTMPFS_MOUNT); skipped if so. */
	{"devtmpfs", "/dev", "devtmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755", false},
	{"devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "mode=0620,ptmxmode=0666", false},
	/* tmpfs pages are RAM: sizes are shares of the guest's memory, so that filling one file
	 * system ends in ENOSPC, not in the OOM killer (a fixed 512m on a 192 MiB guest did). */
	{"tmpfs", "/dev/shm", "tmpfs", NOSUID_NODEV, "mode=1777,size=10%", false},
	{"tmpfs", "/tmp", "tmpfs", NOSUID_NODEV, "mode=1777,size=25%", true},
	{"tmpfs", "/run", "tmpfs", NOSUID_NODEV | MS_NOEXEC, "mode=0755,size=16m", false},
	/* 0700 and owned by the user: the only place besides /tmp where user code may write. */
	{"tmpfs", SBX_HOME_DIR, "tmpfs", NOSUID_NODEV, "mode=0700,uid=1000,gid=1000,size=40%", true},
};

/* A directory is a mount point when it lives on a different device than its parent. */
static bool is_mount_point(const char *path)
{
	char parent[256];
	struct stat st, pst;
	int n = snprintf(parent, sizeof(parent), "%s/..", path);
	if (n < 0 || (size_t)n >= sizeof(parent))
		return false;
	if (stat(path, &st) < 0 || stat(parent, &pst) < 0)
		return false;
	return st.st_dev != pst.st_dev;
}

static int mount_one(const struct mount_spec *m)
{
	/* Works where the parent is writable (/dev); on the read-only root the image provides it. */
	if (mkdir(m->target, 0755) < 0 && errno != EEXIST && errno != EROFS)
		sbx_log("mkdir %s: %s", m->target, strerror(errno));
	if (is_mount_point(m->target))
		return 0;
	if (mount(m->source, m->target, m->fstype, m->flags, m->data) < 0) {
		int err = errno;
		sbx_log("mount %s on %s: %s", m->fstype, m->target, strerror(err));
		return -err;
	}
	return 0;
}

/* Programs (bash process substitution, /dev/stdin users) expect these; devtmpfs has none. The
 * ptmx link only matters where /dev/ptmx is missing (devtmpfs normally has the device node, which
 * reaches the same devpts instance); ptmxmode=0666 above makes either usable by uid 1000. */
static void make_dev_links(void)
{
	static const char *const links[][2] = {
		{"pts/ptmx", "/dev/ptmx"},
		{"/proc/self/fd", "/dev/fd"},
		{"/proc/self/fd/0", "/dev/stdin"},
		{"/proc/self/fd/1", "/dev/stdout"},
		{"/proc/self/fd/2", "/dev/stderr"},
	};
	for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
		if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
			sbx_log("symlink %s: %s", links[i][1], strerror(errno));
}

/* Mount everything; a failure is logged and the others still tried, since a VM with a missing
 * /dev/shm is still more useful than none. Returns the first error. */
int sbx_mount_all(void)
{
	int first = 0;
	for (size_t i = 0; i < sizeof(mounts) / sizeof(mounts[0]); i++) {
		if (mounts[i].workspace)
			continue; /* below, once /run (the work disk's mount point) is there */
		int rc = mount_one(&mounts[i]);
		if (rc < 0 && first == 0)
			first = rc;
	}
	/* A work disk that cannot be set up leaves the VM on tmpfs (logged): smaller, but working. */
	bool on_disk = sbx_workspace_setup() > 0 && sbx_workspace_bind(SBX_HOME_DIR, "/tmp") == 0;
	for (size_t i = 0; !on_disk && i < sizeof(mounts) / sizeof(mounts[0]); i++) {
		if (!mounts[i].workspace)
			continue;
		int rc = mount_one(&mounts[i]);
		if (rc < 0 && first == 0)
			first = rc;
	}
	/* Defence in depth: set-uid binaries on the image must not lift uid 1000 to root (the runner
	 * also sets no_new_privs). A remount keeps the root read-only. */
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | NOSUID_NODEV, NULL) < 0)
		sbx_log("remount / nosuid,nodev: %s", strerror(errno));
	make_dev_links();
	int rc = sbx_mount_layers();
	if (rc < 0 && first == 0)
		first = rc;
	/* The code file directory: root-owned so that user code cannot swap the file it runs. */
	if (mkdir(SBX_RUN_DIR, 0755) < 0 && errno != EEXIST) {
		int err = errno;
		sbx_log("mkdir %s: %s", SBX_RUN_DIR, strerror(err));
		if (first == 0)
			first = -err;
	}
	return first;
}

/* Package layers (docs/packages.md). The host attaches a VM's layer as a read-only disk with the
 * serial "sbx-disk-<kind>" (src/_execsbx/qemu_argv.c), like its other disks; a layer is mounted
 * where the image's links lead the interpreter of that kind (images/rootfs/finish-image.sh).
 * Found by serial, not by device name, and only kinds of this table (other disks' kinds are not
 * layers): the serial comes from the host, but a wrong one must still not pick the mount point.
 * Read-only, nosuid, nodev; not noexec, which would refuse the PROT_EXEC mappings of native
 * extension modules. */
static const char *const layer_kinds[] = {"python", "javascript"};
#define LAYER_MOUNT_DIR "/usr/lib/sbx/layers/"

int sbx_read_serial(const char *name, char *buf, size_t size)
{
	char path[96];
	int n = snprintf(path, sizeof(path), "/sys/block/%s/serial", name);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t got = read(fd, buf, size - 1);
	int err = errno;
	close(fd);
	if (got < 0)
		return -err;
	buf[got] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

int sbx_find_disk(const char *kind, char *dev, size_t size)
{
	DIR *dir = opendir("/sys/block");
	if (!dir)
		return -errno;
	char want[64];
	int w = snprintf(want, sizeof(want), SBX_DISK_SERIAL_PREFIX "%s", kind);
	if (w < 0 || (size_t)w >= sizeof(want)) {
		closedir(dir);
		return -ENAMETOOLONG;
	}
	int rc = -ENOENT;
	struct dirent *e;
	while (rc == -ENOENT && (e = readdir(dir)) != NULL) {
		char serial[64];
		if (strncmp(e->d_name, "vd", 2) != 0 ||
		    sbx_read_serial(e->d_name, serial, sizeof(serial)) < 0 || strcmp(serial, want) != 0)
			continue;
		int n = snprintf(dev, size, "/dev/%s", e->d_name);
		rc = n > 0 && (size_t)n < size ? 0 : -ENAMETOOLONG;
	}
	closedir(dir);
	return rc;
}

static int mount_layer(const char *name, const char *kind)
{
	char dev[64], target[64];
	int n = snprintf(dev, sizeof(dev), "/dev/%s", name);
	int m = snprintf(target, sizeof(target), LAYER_MOUNT_DIR "%s", kind);
	if (n < 0 || (size_t)n >= sizeof(dev) || m < 0 || (size_t)m >= sizeof(target))
		return -ENAMETOOLONG;
	if (mount(dev, target, "erofs", MS_RDONLY | NOSUID_NODEV, NULL) < 0) {
		int err = errno;
		sbx_log("mount package layer %s on %s: %s", dev, target, strerror(err));
		return -err;
	}
	return 0;
}

int sbx_mount_layers(void)
{
	DIR *dir = opendir("/sys/block");
	if (!dir)
		return -errno;
	int first = 0;
	struct dirent *e;
	while ((e = readdir(dir)) != NULL) {
		char serial[64];
		if (strncmp(e->d_name, "vd", 2) != 0 ||
		    sbx_read_serial(e->d_name, serial, sizeof(serial)) < 0 ||
		    strncmp(serial, SBX_DISK_SERIAL_PREFIX, strlen(SBX_DISK_SERIAL_PREFIX)) != 0)
			continue;
		const char *kind = serial + strlen(SBX_DISK_SERIAL_PREFIX);
		for (size_t i = 0; i < sizeof(layer_kinds) / sizeof(layer_kinds[0]); i++) {
			if (strcmp(kind, layer_kinds[i]) != 0)
				continue;
			int rc = mount_layer(e->d_name, kind);
			if (rc < 0 && first == 0)
				first = rc;
		}
	}
	closedir(dir);
	return first;
}

/* The kernel hands init /dev/console as fds 0-2, but if it could not, the first fds the agent opens
 * would land on 0-2 and later be clobbered when a child dup2()s its pipes there. Fill any gap. */
int sbx_ensure_std_fds(void)
{
	for (int fd = 0; fd <= 2; fd++) {
		if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
			continue;
		int n = open("/dev/console", O_RDWR | O_NOCTTY);
		if (n < 0)
			n = open("/dev/null", O_RDWR);
		if (n < 0)
			return -errno;
		if (n != fd) {
			/* Lower fds were filled first, so this only happens if fd was taken meanwhile. */
			close(n);
			return -EBADF;
		}
	}
	return 0;
}
