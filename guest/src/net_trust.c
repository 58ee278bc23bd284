/* The CA trust store: see net_trust.h. */
#include "net_trust.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "cleanup.h"

void sbx_net_boot_trust(void)
{
	if (symlink(SBX_NET_IMAGE_CA_FILE, SBX_NET_CA_FILE) < 0 && errno != EEXIST)
		sbx_log("symlink %s: %s", SBX_NET_CA_FILE, strerror(errno));
	if (symlink("/dev/null", SBX_NET_NODE_CA_FILE) < 0 && errno != EEXIST)
		sbx_log("symlink %s: %s", SBX_NET_NODE_CA_FILE, strerror(errno));
}

bool sbx_net_trust_ready(void)
{
	struct stat st;
	return lstat(SBX_NET_CA_FILE, &st) == 0 && lstat(SBX_NET_NODE_CA_FILE, &st) == 0;
}

/* The host's CA bundle replaces the symlink at path (written aside, then renamed: a client never
 * reads half a bundle). */
static int install_ca_at(const char *path, const char *tmp, const uint8_t *pem, size_t len)
{
	_cleanup_close_ int fd =
		open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return -errno;
	while (len) {
		ssize_t w = write(fd, pem, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int err = w < 0 ? errno : EIO;
			unlink(tmp);
			return -err;
		}
		pem += w;
		len -= (size_t)w;
	}
	if (fchmod(fd, 0644) < 0 || rename(tmp, path) < 0) {
		int err = errno;
		unlink(tmp);
		return -err;
	}
	return 0;
}

int sbx_net_install_ca(const uint8_t *pem, size_t len)
{
	int rc = install_ca_at(SBX_NET_CA_FILE, SBX_NET_CA_FILE ".new", pem, len);
	if (rc < 0)
		return rc;
	return install_ca_at(SBX_NET_NODE_CA_FILE, SBX_NET_NODE_CA_FILE ".new", pem, len);
}
