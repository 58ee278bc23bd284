/* RESEED: see reseed.h. */
#include "reseed.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "protocol.h"

static int reseed_kernel_rng(const uint8_t *seed, size_t n, const char **why)
{
	/* struct rand_pool_info ends in a flexible array: a buffer of the right size and alignment. */
	union {
		struct rand_pool_info info;
		uint8_t raw[sizeof(struct rand_pool_info) + SBX_RESEED_BYTES];
	} req;

	_cleanup_close_ int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		*why = "open /dev/urandom";
		return -errno;
	}
	memset(&req, 0, sizeof(req));
	req.info.entropy_count = (int)(n * 8);
	req.info.buf_size = (int)n;
	memcpy(req.info.buf, seed, n);
	if (ioctl(fd, RNDADDENTROPY, &req.info) < 0) {
		*why = "RNDADDENTROPY";
		return -errno;
	}
	if (ioctl(fd, RNDRESEEDCRNG) < 0) {
		*why = "RNDRESEEDCRNG";
		return -errno;
	}
	return 0;
}

int sbx_handle_reseed(const uint8_t *payload, size_t n, const char **why)
{
	if (n != SBX_RESEED_PAYLOAD_SIZE) {
		*why = "payload length";
		return -EINVAL;
	}
	int rc = reseed_kernel_rng(payload, SBX_RESEED_BYTES, why);
	if (rc < 0)
		return rc;
	uint64_t ns = 0;
	for (unsigned i = 0; i < 8; i++)
		ns |= (uint64_t)payload[SBX_RESEED_BYTES + i] << (8 * i);
	if (ns != 0) {
		struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
				      .tv_nsec = (long)(ns % 1000000000u)};
		if (clock_settime(CLOCK_REALTIME, &ts) < 0) {
			*why = "clock_settime";
			return -errno;
		}
	}
	return 0;
}
