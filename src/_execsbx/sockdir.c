/* See sockdir.h. */
#define _GNU_SOURCE 1
#include "sockdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int sbx_sockdir_create(struct sbx_sockdir *d, const char *parent)
{
	d->path[0] = 0;
	char tmpl[PATH_MAX];
	int n = snprintf(tmpl, sizeof(tmpl), "%s/sbx-vm-XXXXXX", parent);
	if (n < 0 || (size_t)n >= sizeof(tmpl) - 108) /* leave room for a sun_path under it */
		return -ENAMETOOLONG;
	if (!mkdtemp(tmpl)) /* mode 0700 by definition */
		return -errno;
	/* mkdtemp applies the umask to 0700 (only ever narrower); make it exact anyway. */
	if (chmod(tmpl, 0700) < 0) {
		int e = errno;
		rmdir(tmpl);
		return -e;
	}
	memcpy(d->path, tmpl, (size_t)n + 1);
	return 0;
}

void sbx_sockdir_remove(struct sbx_sockdir *d)
{
	if (!d->path[0])
		return;
	int dfd = open(d->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd >= 0) {
		DIR *dir = fdopendir(dfd);
		if (dir) {
			struct dirent *e;
			while ((e = readdir(dir)))
				if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
					unlinkat(dirfd(dir), e->d_name, 0);
			closedir(dir);
		} else {
			close(dfd);
		}
	}
	rmdir(d->path);
	d->path[0] = 0;
}

int sbx_peer_check(int fd, uid_t expect_uid, pid_t expect_pid)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return -errno;
	if (len != sizeof(cred))
		return -EIO;
	if (cred.uid != expect_uid || (expect_pid > 0 && cred.pid != expect_pid))
		return -EPERM;
	return 0;
}
