/* See namespaces.h. Why each step: docs/security.md, "Host layers". */
#define _GNU_SOURCE 1
#include "namespaces.h"
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* linux/mount.h (5.12): not in every libc's headers. */
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#define SBX_MOUNT_ATTR_RDONLY 0x00000001
#define SBX_MOUNT_ATTR_NOSUID 0x00000002
struct sbx_mount_attr {
	uint64_t attr_set, attr_clr, propagation, userns_fd;
};

int sbx_ns_clone_flags(int vm_has_network)
{
	int flags = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID;
	if (!vm_has_network)
		flags |= CLONE_NEWNET;
	return flags;
}

int sbx_ns_have_mount_setattr(void)
{
	/* An invalid call: EINVAL/EBADF when the syscall exists, ENOSYS when not. */
	long rc = syscall(SYS_mount_setattr, -1, "", 0xffffffffu, NULL, 0);
	return !(rc < 0 && errno == ENOSYS);
}

/* "/proc/self/fd/N" into buf (at least 32 bytes), without stdio: async-signal-safe. */
static const char *fd_path(char *buf, int fd)
{
	static const char prefix[] = "/proc/self/fd/";
	char digits[12];
	int n = 0;
	unsigned v = (unsigned)fd;
	do
		digits[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < (int)sizeof(digits));
	memcpy(buf, prefix, sizeof(prefix) - 1);
	char *p = buf + sizeof(prefix) - 1;
	while (n)
		*p++ = digits[--n];
	*p = 0;
	return buf;
}

/* The new root: see namespaces.h. Every source is opened (O_PATH) before the tmpfs goes on
 * plan->mnt, so that a source below that directory is not hidden by it, and bound from its
 * /proc/self/fd link (the host's /proc is still there). */
static int make_root(const struct sbx_root_plan *plan, int new_pid_ns, int read_only,
		     const char **what)
{
	int fds[SBX_ROOT_FILES_MAX];
	int rc = 0;
	unsigned opened = 0;
	char link[32];
	if (plan->nfiles > SBX_ROOT_FILES_MAX) {
		*what = "root: too many files";
		return -E2BIG;
	}
	*what = "open(O_PATH) of a file for QEMU's root";
	for (; opened < plan->nfiles; opened++) {
		fds[opened] = open(plan->sources[opened], O_PATH | O_CLOEXEC);
		if (fds[opened] < 0) {
			rc = -errno;
			goto out;
		}
	}
	/* nosuid, nodev, noexec on the tmpfs itself: its own entries are only empty mount points;
	 * each bind keeps its source mount's flags (the binary stays executable, /dev/null a
	 * device). */
	*what = "mount(tmpfs) for QEMU's root";
	if (mount("tmpfs", plan->mnt, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  "mode=0755,size=64k,nr_inodes=4096") < 0) {
		rc = -errno;
		goto out;
	}
	*what = "mkdir in QEMU's root";
	for (unsigned i = 0; i < plan->ndirs; i++)
		if (mkdir(plan->dirs[i], 0755) < 0 && errno != EEXIST) {
			rc = -errno;
			goto out;
		}
	for (unsigned i = 0; i < plan->nfiles; i++) {
		struct stat st;
		*what = "fstat of a file for QEMU's root";
		if (fstat(fds[i], &st) < 0) {
			rc = -errno;
			goto out;
		}
		*what = "mount point in QEMU's root";
		if (S_ISDIR(st.st_mode)) {
			if (mkdir(plan->targets[i], 0755) < 0 && errno != EEXIST) {
				rc = -errno;
				goto out;
			}
		} else {
			int t = open(plan->targets[i], O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0444);
			if (t < 0) {
				rc = -errno;
				goto out;
			}
			close(t);
		}
		*what = "mount(MS_BIND) into QEMU's root";
		if (mount(fd_path(link, fds[i]), plan->targets[i], NULL, MS_BIND, NULL) < 0) {
			rc = -errno;
			goto out;
		}
	}
	*what = "mkdir(proc) in QEMU's root";
	if (mkdir(plan->proc, 0555) < 0 && errno != EEXIST) {
		rc = -errno;
		goto out;
	}
	if (new_pid_ns) {
		*what = "mount(proc) in QEMU's root";
		if (mount("proc", plan->proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "hidepid=2") < 0) {
			rc = -errno;
			goto out;
		}
	}
	/* Read-only, all of it: the tmpfs, every bind, /proc. */
	if (read_only) {
		struct sbx_mount_attr attr = {.attr_set = SBX_MOUNT_ATTR_RDONLY |
							  SBX_MOUNT_ATTR_NOSUID};
		*what = "mount_setattr(QEMU's root, AT_RECURSIVE, MOUNT_ATTR_RDONLY)";
		if (syscall(SYS_mount_setattr, AT_FDCWD, plan->mnt, AT_RECURSIVE, &attr,
			    sizeof(attr)) < 0) {
			rc = -errno;
			goto out;
		}
	} else {
		*what = "mount(MS_REMOUNT|MS_RDONLY) in QEMU's root";
		for (unsigned i = 0; i < plan->nfiles; i++)
			if (mount(NULL, plan->targets[i], NULL,
				  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, NULL) < 0) {
				rc = -errno;
				goto out;
			}
		if (mount(NULL, plan->mnt, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV |
							 MS_NOEXEC,
			  NULL) < 0) {
			rc = -errno;
			goto out;
		}
	}
	/* pivot_root(".", "."): the tmpfs becomes the root, the host's tree is stacked on it and
	 * detached at once (nothing of it stays reachable, not even through "..": chroot(2)
	 * alone would leave it mounted). */
	*what = "chdir(QEMU's root)";
	if (chdir(plan->mnt) < 0) {
		rc = -errno;
		goto out;
	}
	*what = "pivot_root";
	if (syscall(SYS_pivot_root, ".", ".") < 0) {
		rc = -errno;
		goto out;
	}
	*what = "umount2(old root, MNT_DETACH)";
	if (umount2(".", MNT_DETACH) < 0) {
		rc = -errno;
		goto out;
	}
	*what = "chdir(/)";
	if (chdir("/") < 0)
		rc = -errno;
out:
	for (unsigned i = 0; i < opened; i++)
		close(fds[i]);
	return rc;
}

int sbx_ns_setup_child(int clone_flags, int read_only, const struct sbx_root_plan *plan,
		       const char **what)
{
	/* Every namespace but the PID one is made here, by the child, rather than by the clone()
	 * in the parent: creating a network namespace waits on locks that the teardown of other
	 * ones (every closed VM's) holds, and copying the mount tree on namespace_sem, for tens of
	 * milliseconds on a busy host; that wait is the child's, not the caller's event loop. */
	int rest = clone_flags & ~CLONE_NEWPID;
	if (rest) {
		*what = "unshare";
		if (unshare(rest) < 0)
			return -errno;
	}
	if (clone_flags & CLONE_NEWNS) {
		/* Without this, mounts made here would propagate to the host's shared mounts
		 * (systemd makes / shared) and the host's later mounts would appear here. */
		*what = "mount(/, MS_REC|MS_PRIVATE)";
		if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
			return -errno;
		if (plan) {
			int rc = make_root(plan, (clone_flags & CLONE_NEWPID) != 0, read_only, what);
			if (rc < 0)
				return rc;
		} else {
			if (clone_flags & CLONE_NEWPID) {
				*what = "mount(proc)";
				if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
					  "hidepid=2") < 0)
					return -errno;
			}
			if (read_only) {
				struct sbx_mount_attr attr = {.attr_set = SBX_MOUNT_ATTR_RDONLY};
				*what = "mount_setattr(/, AT_RECURSIVE, MOUNT_ATTR_RDONLY)";
				if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &attr,
					    sizeof(attr)) < 0)
					return -errno;
			}
		}
	}
	if (clone_flags & CLONE_NEWUTS) {
		*what = "sethostname";
		if (sethostname("sbx-qemu", 8) < 0)
			return -errno;
	}
	return 0;
}
