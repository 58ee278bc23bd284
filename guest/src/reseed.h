/* RESEED (memory snapshots): every VM restored from one snapshot starts with the same
 * kernel RNG state, so the host sends fresh bytes before anything runs in a restored guest. */
#ifndef SBX_RESEED_H
#define SBX_RESEED_H

#include <stddef.h>
#include <stdint.h>

/* Handle a RESEED payload (protocol.h): credit the seed to the kernel's input pool
 * (RNDADDENTROPY on /dev/urandom) and force a CRNG reseed (RNDRESEEDCRNG), so that every later
 * getrandom()/urandom read of every process depends on it; then set CLOCK_REALTIME to the host's
 * time (the snapshot's clock is stale). 0 or -errno (-EINVAL: malformed payload); *why names
 * the failing step. */
int sbx_handle_reseed(const uint8_t *payload, size_t n, const char **why);

#endif /* SBX_RESEED_H */
