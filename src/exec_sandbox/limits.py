"""Hard limits of the public API, checked by validation.py before any VM starts. The guest agent
enforces the output limits too."""

from __future__ import annotations

CODE_MAX_BYTES = 1024 * 1024
STDOUT_LIMIT_BYTES = 1024 * 1024
STDERR_LIMIT_BYTES = 100 * 1024
MAX_ENV_VARS = 100
ENV_NAME_MAX_BYTES = 256
ENV_VALUE_MAX_BYTES = 32 * 1024
MIN_TIMEOUT_SECONDS = 1
MAX_TIMEOUT_SECONDS = 300
MIN_MEMORY_MB = 128
MAX_MEMORY_MB = 64 * 1024
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
