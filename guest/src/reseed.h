/* RESEED (issue 5, memory snapshots): every VM restored from one snapshot starts with the same
 * kernel RNG state, so the host sends fresh bytes before anything runs in a restored guest. */
#ifndef SBX_RESEED_H
#define SBX_RESEED_H

#include <stddef.h>
#include <stdint.h>

/* Credit seed to the kernel's input pool (RNDADDENTROPY on /dev/urandom) and force a CRNG
 * reseed (RNDRESEEDCRNG), so that every later getrandom()/urandom read of every process depends
 * on the seed. 0 or -errno; *why names the failing step. */
int sbx_reseed_kernel_rng(const uint8_t *seed, size_t n, const char **why);

#endif /* SBX_RESEED_H */
