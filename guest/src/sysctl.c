/* Kernel settings whose defaults are wrong for a sandbox, written by the agent at boot (after
 * /proc is mounted, before any user code). Set here rather than in the kernel config so that a
 * change does not force a kernel rebuild. */
#include "sysctl.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "cleanup.h"

int sbx_write_sysctl(const char *path, const char *value)
{
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t len = strlen(value);
	ssize_t n = write(fd, value, len);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EIO;
}

static const struct {
	const char *path;
	const char *value;
} settings[] = {
	/* The kernel log (/dev/kmsg, syslog(2) READ_ALL) only for CAP_SYSLOG: uid 1000 must not read
	 * kernel addresses, boot details or the messages other processes caused. */
	{"/proc/sys/kernel/dmesg_restrict", "1"},
};

void sbx_apply_sysctls(void)
{
	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
		int rc = sbx_write_sysctl(settings[i].path, settings[i].value);
		if (rc < 0)
			sbx_log("%s = %s: %s", settings[i].path, settings[i].value, strerror(-rc));
	}
}
