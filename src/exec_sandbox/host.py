"""Facts about the host that choose how QEMU runs: the QEMU binary, the accelerator, the TSC
frequency. Each is probed once per process."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess

from .errors import VmPermanentError

log = logging.getLogger("exec_sandbox")

QEMU_BINARY_NAME = "qemu-system-x86_64"
# A KVM probe that is still running after this long has passed the point where a broken KVM
# (for example a nested host that rejects MSR writes) makes QEMU abort.
_KVM_PROBE_SECONDS = 1.0


@functools.cache
def qemu_binary() -> str:
    """$EXEC_SANDBOX_QEMU, else qemu-system-x86_64 on PATH."""
    path = os.environ.get("EXEC_SANDBOX_QEMU") or shutil.which(QEMU_BINARY_NAME)
    if not path:
        raise VmPermanentError(
            f"{QEMU_BINARY_NAME} not found: install it (apt-get install qemu-system-x86) "
            "or set EXEC_SANDBOX_QEMU"
        )
    return path


@functools.cache
def accelerator() -> str:
    """'kvm' when /dev/kvm is usable by QEMU, 'tcg' (software emulation) otherwise.

    $EXEC_SANDBOX_ACCEL=kvm|tcg forces one. Opening /dev/kvm is not enough: some nested hosts
    expose a /dev/kvm on which QEMU aborts, so QEMU itself is started once, paused, to find out.
    """
    forced = os.environ.get("EXEC_SANDBOX_ACCEL")
    if forced:
        if forced not in ("kvm", "tcg"):
            raise VmPermanentError(f"EXEC_SANDBOX_ACCEL must be kvm or tcg, got {forced!r}")
        return forced
    reason = _kvm_unusable_reason()
    if reason:
        log.info("using TCG (software emulation): %s", reason)
        return "tcg"
    return "kvm"


def _kvm_unusable_reason() -> str | None:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"/dev/kvm: {exc.strerror}"
    os.close(fd)
    argv = [qemu_binary(), "-accel", "kvm", "-cpu", "host", "-M", "microvm", "-nodefaults",
            "-no-user-config", "-display", "none", "-S"]  # fmt: skip
    probe = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, err = probe.communicate(timeout=_KVM_PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return None
    first_line = err.decode(errors="replace").strip().splitlines()[:1]
    return f"QEMU with KVM exited at once ({first_line[0] if first_line else probe.returncode})"


@functools.cache
def tsc_khz() -> int:
    """The host TSC frequency in kHz, 0 when unknown. Under TCG the guest kernel calibrates its
    clock against it, and without `tsc_early_khz=` about one boot in five hangs."""
    from ._vm import measure_tsc_khz

    return measure_tsc_khz()
