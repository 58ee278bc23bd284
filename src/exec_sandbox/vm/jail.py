"""The host jail around each QEMU process, as the Python side configures and reports it.

The layers themselves are in C (src/_execsbx/jail.c); this module chooses the limits for one VM,
resolves the optional unprivileged user, and logs every layer the host could not provide, so that
a missing layer is never silent (docs/security.md)."""

from __future__ import annotations

import logging
import os
import pwd
from typing import Any

from ..errors import VmConfigError

log = logging.getLogger("exec_sandbox")

# QEMU's own memory on top of the guest's RAM: TCG's translation cache (capped at
# SBX_TCG_TB_SIZE_MB = 128 MiB by qemu_argv.c; uncapped it grows towards 1 GiB in a long session
# and the cgroup OOM-kills QEMU), device state, the binary's mappings. Measured peak for a
# 192 MiB guest after boot and a run: ~95 MiB; the rest is room for a full translation cache.
QEMU_MEMORY_OVERHEAD_MB = 320
# QEMU's threads: main loop, one per vCPU, RCU, a few I/O workers. Not for the guest's processes,
# which live inside the guest kernel.
QEMU_PIDS_MAX = 64
# One core per vCPU, plus half a core for the main loop (virtio I/O).
CPU_PERCENT_PER_VCPU = 100
CPU_PERCENT_MAIN_LOOP = 50

QEMU_USER_ENV = "EXEC_SANDBOX_QEMU_USER"

_reported: set[tuple[str, str]] = set()


def qemu_user() -> tuple[int, int] | None:
    """(uid, gid) from $EXEC_SANDBOX_QEMU_USER (a user name or a numeric uid), or None."""
    value = os.environ.get(QEMU_USER_ENV, "").strip()
    if not value:
        return None
    try:
        entry = pwd.getpwuid(int(value)) if value.isdigit() else pwd.getpwnam(value)
    except (KeyError, ValueError) as exc:
        raise VmConfigError(f"{QEMU_USER_ENV}={value!r}: no such user") from exc
    return entry.pw_uid, entry.pw_gid


def jail_options(memory_mb: int, vcpus: int = 1, network: bool = False) -> dict[str, int]:
    """The jail dict for _execsbx.Vm: cgroup limits derived from the guest's size."""
    options = {
        "network": int(network),
        "memory_mb": memory_mb + QEMU_MEMORY_OVERHEAD_MB,
        "cpu_percent": vcpus * CPU_PERCENT_PER_VCPU + CPU_PERCENT_MAIN_LOOP,
        "pids_max": QEMU_PIDS_MAX,
    }
    user = qemu_user()
    if user is not None:
        options["uid"], options["gid"] = user
    return options


def report_layers(status: list[tuple[str, bool, str]]) -> None:
    """Log each inactive layer once per process and reason (WARNING), active ones at DEBUG."""
    for layer, active, detail in status:
        if active:
            log.debug("host jail: %s: %s", layer, detail)
            continue
        key = (layer, detail)
        if key in _reported:
            continue
        _reported.add(key)
        level = logging.INFO if layer == "user" else logging.WARNING
        log.log(level, "host jail: %s is off: %s", layer, detail)


def usage_figures(usage: Any) -> tuple[int | None, int | None]:
    """(cpu ms, peak memory MiB) from Vm.resource_usage()'s (ns, bytes), None where unknown."""
    if not usage:
        return None, None
    cpu_ns, peak = usage
    cpu_ms = None if cpu_ns is None else int(cpu_ns // 1_000_000)
    peak_mb = None if peak is None else int(-(-peak // (1024 * 1024)))
    return cpu_ms, peak_mb
