/* The CPU tag that goes with node's startup snapshot (SBX_FILE_NODE_SNAPSHOT in protocol.h).
 *
 * V8 loads a startup snapshot only into the build of V8 that made it, with the same flags, on the
 * same CPU feature set (it checks a hash of the three and aborts otherwise). The image fixes the
 * build and the agent the flags; the tag fixes the rest: what the CPUID instruction reports
 * about the vendor, family and features, and which register states the kernel enabled (XCR0),
 * i.e. what V8 reads when it detects the CPU. Never the APIC id or anything else that differs
 * between two vCPUs or two boots of one machine: two VMs of one configuration on one host have
 * the same tag. */
#ifndef SBX_CPUTAG_H
#define SBX_CPUTAG_H

#include <stdbool.h>
#include <stdint.h>

#include "protocol.h"

/* Fills tag; false where the CPU cannot be told apart (no CPUID): no snapshot is then taken in. */
bool sbx_cpu_tag(uint8_t tag[SBX_NODE_TAG_SIZE]);

#endif /* SBX_CPUTAG_H */
