/* Time-stamp counter frequency, measured. */
#ifndef SBX_TSC_H
#define SBX_TSC_H

#include <stdint.h>

/* The TSC frequency in kHz, measured against CLOCK_MONOTONIC over about 25 ms (the calling
 * thread sleeps meanwhile). 0 on non-x86_64 builds or if the measurement failed. */
uint64_t sbx_tsc_khz(void);

#endif /* SBX_TSC_H */
