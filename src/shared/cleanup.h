/* Ownership helpers: a variable declared with one of these attributes releases what it owns when
 * it goes out of scope, so that every early `return -errno` path cleans up. To hand ownership on,
 * take it out with TAKE_FD / TAKE_PTR (which leave -1 / NULL behind). */
#ifndef SBX_CLEANUP_H
#define SBX_CLEANUP_H

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static inline void sbx_close_fd(int *fd)
{
	if (*fd >= 0) {
		int saved = errno;
		close(*fd);
		errno = saved;
		*fd = -1;
	}
}

static inline void sbx_free_ptr(void *p)
{
	free(*(void **)p);
}

#define _cleanup_close_ __attribute__((cleanup(sbx_close_fd)))
#define _cleanup_free_ __attribute__((cleanup(sbx_free_ptr)))

#define TAKE_FD(fd)                  \
	({                           \
		int _taken = (fd);   \
		(fd) = -1;           \
		_taken;              \
	})
#define TAKE_PTR(p)                      \
	({                               \
		__typeof__(p) _taken = (p); \
		(p) = NULL;              \
		_taken;                  \
	})

#endif /* SBX_CLEANUP_H */
