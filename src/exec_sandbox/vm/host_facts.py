"""Facts about the host that choose how QEMU runs: the QEMU binary, the accelerator, the TSC
frequency. Each is probed once per process."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess

from ..errors import VmPermanentError

log = logging.getLogger("exec_sandbox")

QEMU_BINARY_NAME = "qemu-system-x86_64"

# The KVM probe's guest: a 64 KiB firmware image (-bios) whose reset vector (the last 16 bytes,
# where an x86 CPU starts, in real mode) runs `mov al, 0x31; out 0xf4, al; hlt; jmp $-1`. The
# write reaches QEMU's isa-debug-exit device, which ends QEMU with status (0x31 << 1) | 1 = 99:
# that status proves a vCPU ran guest code under the accelerator. Nothing else does (a QEMU that
# merely lives has proved nothing: a broken KVM aborts when the vCPU is first set up, and under
# CPU load that can be seconds late).
_PROBE_PORT = 0xF4
_PROBE_CODE = bytes([0xB0, 0x31, 0xE6, _PROBE_PORT, 0xF4, 0xEB, 0xFD])
_PROBE_EXIT_STATUS = (0x31 << 1) | 1
_PROBE_BIOS_SIZE = 64 * 1024  # QEMU wants a multiple of 64 KiB
# Only a guard against a QEMU that hangs: the probe normally ends in well under a second. A probe
# that hits it is not taken as a working KVM.
_KVM_PROBE_HANG_SECONDS = 30.0


@functools.cache
def qemu_binary() -> str:
    """$EXEC_SANDBOX_QEMU, else qemu-system-x86_64 on PATH."""
    configured = os.environ.get("EXEC_SANDBOX_QEMU")
    if configured and not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
        raise VmPermanentError(f"EXEC_SANDBOX_QEMU={configured!r} is not an executable file")
    path = configured or shutil.which(QEMU_BINARY_NAME)
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
    expose a /dev/kvm on which QEMU aborts, so QEMU itself runs a few instructions of guest code
    under KVM once, and KVM is used only if they ran (`probe_accelerator`).
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


@functools.cache
def _kvm_unusable_reason() -> str | None:
    """Why KVM cannot be used here, or None when QEMU ran guest code under it (once a process)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"/dev/kvm: {exc.strerror}"
    os.close(fd)
    # The caller may open it; QEMU runs under its own uid (vm/jail.py), which must too.
    from .jail import kvm_problem

    problem = kvm_problem()
    if problem:
        return problem
    return probe_accelerator(qemu_binary(), "kvm")


def probe_accelerator(
    qemu: str, accel: str, *, hang_seconds: float = _KVM_PROBE_HANG_SECONDS
) -> str | None:
    """None if `qemu` runs the probe's guest code under `accel` (it exits with the status only
    that code produces), else why not: QEMU's own error, its exit status, or the hang guard."""
    cpu = "host" if accel == "kvm" else "max"
    bios = os.memfd_create("sbx-accel-probe", os.MFD_CLOEXEC)
    try:
        image = bytearray(b"\xf4" * _PROBE_BIOS_SIZE)  # hlt everywhere else
        image[-16 : -16 + len(_PROBE_CODE)] = _PROBE_CODE
        os.write(bios, image)
        argv = [
            qemu,
            "-accel",
            accel,
            "-cpu",
            cpu,
            "-M",
            "microvm",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-m",
            "16",
            "-bios",
            f"/proc/self/fd/{bios}",
            "-device",
            f"isa-debug-exit,iobase={_PROBE_PORT:#x},iosize=1",
        ]
        try:
            probe = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(bios,),
                timeout=hang_seconds,
                check=False,
            )
        except subprocess.TimeoutExpired:  # run() has killed and reaped it
            return (
                f"QEMU with {accel.upper()} did not run the probe's guest code within "
                f"{hang_seconds:.0f} s"
            )
        except OSError as exc:
            return f"cannot run {qemu}: {exc}"
    finally:
        os.close(bios)
    if probe.returncode == _PROBE_EXIT_STATUS:
        return None
    errors = probe.stderr.decode(errors="replace").strip().splitlines()
    what = errors[0] if errors else f"exit status {probe.returncode}"
    return f"QEMU with {accel.upper()} did not run guest code ({what})"


@functools.cache
def tsc_khz() -> int:
    """The host TSC frequency in kHz, 0 when unknown. Under TCG the guest kernel calibrates its
    clock against it, and without `tsc_early_khz=` about one boot in five hangs."""
    from .binding import measure_tsc_khz

    return measure_tsc_khz()
