/* Time-stamp counter frequency, measured. */
#ifndef SBX_TSC_H
#define SBX_TSC_H

#include <stdint.h>

#include "sbx_err.h"

/* The TSC frequency in kHz into *khz, measured against CLOCK_MONOTONIC over about 25 ms (the
 * calling thread sleeps meanwhile). 0, or with err filled -EOPNOTSUPP (not an x86_64 build) or
 * -EIO (no plausible measurement) or clock_gettime's error. */
int sbx_tsc_khz(uint64_t *khz, struct sbx_err *err);

#endif /* SBX_TSC_H */
