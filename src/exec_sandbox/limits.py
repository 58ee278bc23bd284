"""Hard limits of the public API, checked by validation.py before any VM starts. The guest agent
enforces the output limits too."""

from __future__ import annotations

from .vm.binding import PROTOCOL_LIMITS

# From the wire protocol's header (src/shared/protocol.h), the one place they are written: the
# host's encoder and the guest agent check the same values.
CODE_MAX_BYTES = PROTOCOL_LIMITS["CODE_MAX"]
STDOUT_LIMIT_BYTES = PROTOCOL_LIMITS["STDOUT_LIMIT_DEFAULT"]
STDERR_LIMIT_BYTES = PROTOCOL_LIMITS["STDERR_LIMIT_DEFAULT"]
MAX_ENV_VARS = PROTOCOL_LIMITS["ENV_MAX_COUNT"]
ENV_NAME_MAX_BYTES = PROTOCOL_LIMITS["ENV_NAME_MAX"]
ENV_VALUE_MAX_BYTES = PROTOCOL_LIMITS["ENV_VALUE_MAX"]
MIN_TIMEOUT_SECONDS = max(1, PROTOCOL_LIMITS["TIMEOUT_MS_MIN"] // 1000)
MAX_TIMEOUT_SECONDS = PROTOCOL_LIMITS["TIMEOUT_MS_MAX"] // 1000
# timeout_seconds=0: no limit (the protocol's TIMEOUT_NONE: the guest arms no timer).
NO_TIMEOUT_MS = PROTOCOL_LIMITS["TIMEOUT_NONE"]
MIN_MEMORY_MB = 128
MAX_MEMORY_MB = 64 * 1024
# The VM's work disk (/home/user and /tmp, docs/design.md "Workspace"), sparse on the host: it
# costs what the guest writes, not its size. Under 64 MB ext4's own metadata is a large share.
MIN_DISK_MB = 64
MAX_DISK_MB = 1024 * 1024
DEFAULT_DISK_MB = 4096
# Virtual CPUs of one VM (run()/session(vcpus=N)); admission counts them against the host's.
MIN_VCPUS = 1
MAX_VCPUS = 8
# When the call asks for none; the warm pool's VMs have this many.
DEFAULT_VCPUS = 1
# How long a cold boot may take before VmTimeoutError. Under TCG on a busy 2-core host a boot
# takes 1-5 s; the margin covers a loaded CI machine.
BOOT_TIMEOUT_SECONDS = 60.0
# After the guest's own timeout the host waits this long for the guest's EXIT before it kills
# the VM itself (a guest that stalls must not hold the caller).
HOST_TIMEOUT_GRACE_SECONDS = 5.0
# A snapshot restore (QEMU start, device state load, RNG reseed) that takes longer than this is
# abandoned for a cold boot. It normally takes 0.05-0.2 s under TCG.
RESTORE_TIMEOUT_SECONDS = 20.0
# How long a request waits for admission by default before VmCapacityError.
ADMISSION_TIMEOUT_SECONDS = 120.0
