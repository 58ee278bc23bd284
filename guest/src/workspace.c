/* The disk workspace. The host attaches an empty, sparse raw file as the disk with the serial
 * "sbx-disk-work" and never reads it: this VM formats it (ext4 without a journal: the disk lives
 * and dies with the VM and its snapshots, so a journal would only cost writes), mounts it and puts
 * /home/user and /tmp on it. A full disk is then ENOSPC for the code that filled it, and files are
 * not RAM: a 192 MiB VM holds gigabytes.
 *
 * A VM restored from a memory snapshot never gets here again: it resumes with the file system
 * already mounted, on its own copy of the snapshot's disk (snapshots/l1.py). So the format is paid
 * by cold boots only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "cleanup.h"
#include "workspace.h"

#define WORK_KIND "work"
#define MKE2FS "/sbin/mke2fs"
/* Not noexec: building and running programs in /home/user is what a workspace is for. */
#define WORK_FLAGS (MS_NOSUID | MS_NODEV)
/* discard: a deleted file's blocks go back to the host (QEMU punches holes in the sparse file).
 * noinit_itable: no background zeroing of inode tables (mke2fs left them lazily uninitialised;
 * on a sparse file they read as zeros anyway), which would write to the disk of every VM and
 * every snapshot for nothing. */
#define WORK_OPTIONS "discard,noinit_itable"

static bool active;

bool sbx_workspace_active(void)
{
	return active;
}

/* 1 if dev holds an ext4 superblock, 0 if not (a new, all-zero disk), -errno. */
static int has_ext4(const char *dev)
{
	_cleanup_close_ int fd = open(dev, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	uint8_t magic[2];
	ssize_t n = pread(fd, magic, sizeof(magic), SBX_EXT4_MAGIC_OFFSET);
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(magic))
		return 0;
	return (unsigned)(magic[0] | magic[1] << 8) == SBX_EXT4_MAGIC;
}

/* mke2fs from the image (e2fsprogs). -m 0: no blocks reserved for root (user code is not root).
 * No resize inode: the disk never grows, and its reserved descriptor blocks are most of a fresh
 * file system's data (2.2 MB of 2.4 on 4 GiB), which every L1 clone and fork copies.
 * lazy_itable_init: inode tables are not zeroed (see WORK_OPTIONS). nodiscard: the disk is a new
 * sparse file, there is nothing to discard. */
static int format(const char *dev)
{
	static const char *const args[] = {
		MKE2FS, "-q", "-F", "-t", "ext4", "-O", "^has_journal,^resize_inode", "-m", "0", "-E",
		"lazy_itable_init=1,nodiscard,root_owner=0:0", "-L", "sbx-work",
	};
	enum { NARGS = sizeof(args) / sizeof(args[0]) };
	/* execve() takes char *const[] for historical reasons; it does not write to the strings. */
	char *argv[NARGS + 2];
	for (size_t i = 0; i < NARGS; i++)
		argv[i] = (char *)(uintptr_t)args[i];
	argv[NARGS] = (char *)(uintptr_t)dev;
	argv[NARGS + 1] = NULL;
	char *envp[] = {(char *)(uintptr_t) "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
	uint64_t start = sbx_now_ns();
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execve(MKE2FS, argv, envp);
		_exit(127);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR)
			return -errno;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		sbx_log("workspace: %s %s failed (status %d)", MKE2FS, dev, status);
		return -EIO;
	}
	sbx_log("workspace: formatted %s in %llu ms", dev,
		(unsigned long long)((sbx_now_ns() - start) / 1000000u));
	return 0;
}

static int make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid)
{
	if (mkdir(path, mode) < 0 && errno != EEXIST)
		return -errno;
	/* Owner and mode set again whatever the disk held: the umask cut the mode at mkdir. */
	if (chown(path, uid, gid) < 0 || chmod(path, mode) < 0)
		return -errno;
	return 0;
}

int sbx_workspace_setup(void)
{
	char dev[64];
	int rc = sbx_find_disk(WORK_KIND, dev, sizeof(dev));
	if (rc == -ENOENT)
		return 0;
	if (rc < 0)
		return rc;
	rc = has_ext4(dev);
	if (rc == 0)
		rc = format(dev);
	if (rc < 0) {
		sbx_log("workspace: %s: %s", dev, strerror(-rc));
		return rc;
	}
	if (mkdir(SBX_WORK_DIR, 0755) < 0 && errno != EEXIST)
		return -errno;
	if (mount(dev, SBX_WORK_DIR, "ext4", WORK_FLAGS, WORK_OPTIONS) < 0) {
		int err = errno;
		sbx_log("workspace: mount %s: %s", dev, strerror(err));
		return -err;
	}
	if ((rc = make_dir(SBX_WORK_DIR, 0755, 0, 0)) < 0 ||
	    (rc = make_dir(SBX_WORK_HOME, 0700, SBX_USER_UID, SBX_USER_GID)) < 0 ||
	    (rc = make_dir(SBX_WORK_TMP, 01777, 0, 0)) < 0) {
		sbx_log("workspace: directories on %s: %s", dev, strerror(-rc));
		umount2(SBX_WORK_DIR, MNT_DETACH);
		return rc;
	}
	return 1;
}

static int bind_dir(const char *source, const char *target)
{
	if (mount(source, target, NULL, MS_BIND, NULL) < 0)
		return -errno;
	/* A bind takes its flags only from a remount of itself. */
	if (mount(NULL, target, NULL, MS_BIND | MS_REMOUNT | WORK_FLAGS, NULL) < 0)
		return -errno;
	return 0;
}

int sbx_workspace_bind(const char *home, const char *tmp)
{
	int rc = bind_dir(SBX_WORK_HOME, home);
	if (rc == 0) {
		rc = bind_dir(SBX_WORK_TMP, tmp);
		if (rc < 0)
			umount2(home, MNT_DETACH);
	}
	if (rc < 0) {
		sbx_log("workspace: binding %s and %s: %s", home, tmp, strerror(-rc));
		return rc;
	}
	active = true;
	return 0;
}
