/* See namespaces.h. Why each step: docs/security.md, "Host layers". */
#define _GNU_SOURCE 1
#include "namespaces.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mount.h>
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

int sbx_ns_setup_child(int clone_flags, int read_only, const char **what)
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
	if (clone_flags & CLONE_NEWUTS) {
		*what = "sethostname";
		if (sethostname("sbx-qemu", 8) < 0)
			return -errno;
	}
	return 0;
}
