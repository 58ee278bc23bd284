"""The host jail around each QEMU process, as the Python side configures and reports it.

The layers themselves are in C (src/_execsbx/jail.c); this module chooses the limits for one VM,
the unprivileged user QEMU runs as (a root caller's QEMU never keeps uid 0 unless the operator
opts out), the files QEMU's own root holds, and the seccomp policy (the allow-list, or the
deny-list for a QEMU the allow-list was not measured on), and logs every layer the host could not
provide, so that a missing layer is never silent (docs/security.md)."""

from __future__ import annotations

import functools
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
from typing import Any

from ..errors import VmConfigError

log = logging.getLogger("exec_sandbox")

# QEMU's own memory on top of the guest's RAM: TCG's translation cache (capped at
# SBX_TCG_TB_SIZE_MB = 128 MiB by qemu_argv.c; uncapped it grows towards 1 GiB in a long session
# and the cgroup OOM-kills QEMU), device state, the binary's mappings. Measured peak for a
# 192 MiB guest after boot and a run: ~95 MiB; the rest is room for a full translation cache.
QEMU_MEMORY_OVERHEAD_MB = 320
# QEMU's threads: the main loop, one per vCPU (up to 8), RCU, a migration thread, and the block
# layer's worker pool, which grows to 64 threads when the host's disk is slow (disks use
# aio=threads). At 64 in all, a loaded host made QEMU fail a thread creation and crash (EAGAIN
# from the pids limit). Not for the guest's processes, which live inside the guest kernel.
QEMU_PIDS_MAX = 128
# One core per vCPU, plus half a core for the main loop (virtio I/O).
CPU_PERCENT_PER_VCPU = 100
CPU_PERCENT_MAIN_LOOP = 50

QEMU_USER_ENV = "EXEC_SANDBOX_QEMU_USER"
# The system user `sbx setup` creates for QEMU (no home, no shell, no password, its own group).
DEFAULT_QEMU_USER = "sbx-qemu"
# Without it (a host where `sbx setup` has not run since): the kernel's overflow ids. Shared with
# other daemons, but a QEMU reaches nothing of theirs: its PID namespace shows it no process, its
# root holds no file of theirs.
FALLBACK_QEMU_IDS = (65534, 65534)
# EXEC_SANDBOX_QEMU_USER values that keep QEMU as root (the opt-out).
_OPT_OUT = ("root", "0")
SECCOMP_ENV = "EXEC_SANDBOX_SECCOMP"
# QEMU versions (major.minor of `qemu --version`) the allow-list was measured on
# (docs/security.md, "The seccomp allow-list"); any other gets the deny-list, with a warning.
MEASURED_QEMU_VERSIONS = ("7.2",)

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


def opted_out() -> bool:
    """The operator keeps QEMU as root ($EXEC_SANDBOX_QEMU_USER=root)."""
    return os.environ.get(QEMU_USER_ENV, "").strip() in _OPT_OUT


def qemu_identity() -> tuple[tuple[int, int] | None, str]:
    """Who QEMU runs as, and why: (uid, gid) or None (the caller's own), and a sentence.

    A root caller's QEMU runs as $EXEC_SANDBOX_QEMU_USER, else as sbx-qemu, else as nobody; an
    unprivileged caller's QEMU keeps the caller's uid (it cannot switch, and has no privilege to
    lose)."""
    value = os.environ.get(QEMU_USER_ENV, "").strip()
    if value in _OPT_OUT:
        return None, (
            f"{QEMU_USER_ENV}={value}: QEMU keeps uid 0 and every capability (the opt-out)"
        )
    user = qemu_user()
    if user is not None:
        return user, f"{QEMU_USER_ENV}={value}"
    if os.geteuid() != 0:
        return None, f"the caller is unprivileged (uid {os.geteuid()}): QEMU keeps its uid"
    default = _default_user()
    if default is None:
        return FALLBACK_QEMU_IDS, (
            f"no user {DEFAULT_QEMU_USER} (`sbx setup` creates it): QEMU runs as nobody "
            f"(uid {FALLBACK_QEMU_IDS[0]})"
        )
    return default, f"the system user {DEFAULT_QEMU_USER}"


@functools.cache
def _default_user() -> tuple[int, int] | None:
    """sbx-qemu's ids, looked up once per process: jail_options runs on the event loop for every
    VM, and a user database behind NSS (LDAP, sssd) may take its time."""
    try:
        entry = pwd.getpwnam(DEFAULT_QEMU_USER)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def ensure_qemu_user() -> str:
    """Create the system user QEMU runs as, if missing (root only; `sbx setup`)."""
    try:
        pwd.getpwnam(DEFAULT_QEMU_USER)
        return f"user {DEFAULT_QEMU_USER}: present"
    except KeyError:
        pass
    if os.geteuid() != 0:
        return f"user {DEFAULT_QEMU_USER}: not needed (QEMU keeps an unprivileged caller's uid)"
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    subprocess.run(
        [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "exec-sandbox QEMU",
            DEFAULT_QEMU_USER,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    _default_user.cache_clear()
    return f"user {DEFAULT_QEMU_USER}: created"


def kvm_groups() -> list[int]:
    """/dev/kvm's group when it grants read and write: QEMU gets it as its one supplementary
    group, so that KVM works under its uid without that user being in any group."""
    try:
        st = os.stat("/dev/kvm")
    except OSError:
        return []
    rw = stat.S_IRGRP | stat.S_IWGRP
    return [st.st_gid] if st.st_gid != 0 and st.st_mode & rw == rw else []


def kvm_problem() -> str | None:
    """Why QEMU's uid cannot open /dev/kvm, or None (it can, or QEMU keeps the caller's)."""
    user, _ = qemu_identity()
    try:
        st = os.stat("/dev/kvm")
    except OSError as exc:
        return f"/dev/kvm: {exc.strerror}"
    if user is None:
        return None
    uid, _gid = user
    rw = stat.S_IRUSR | stat.S_IWUSR
    if st.st_uid == uid and st.st_mode & rw == rw:
        return None
    if kvm_groups() or st.st_mode & (stat.S_IROTH | stat.S_IWOTH) == stat.S_IROTH | stat.S_IWOTH:
        return None
    return (
        f"/dev/kvm is {stat.filemode(st.st_mode)} uid {st.st_uid} gid {st.st_gid}: not open to "
        f"QEMU's uid {uid} (make it 0660 with a kvm group, as udev does, or opt out with "
        f"{QEMU_USER_ENV}=root)"
    )


# Firmware QEMU's microvm loads (7.x: qboot.rom; later: bios-microvm.bin), under its data dir.
_FIRMWARE = ("qboot.rom", "bios-microvm.bin")
# Devices QEMU opens: /dev/null (stdin), /dev/urandom (glib, gnutls); /dev/kvm only under KVM
# (jail_options): a TCG QEMU has no use for it, and KVM's ioctls are a surface of their own.
_DEVICES = ("/dev/null", "/dev/urandom")
KVM_DEVICE = "/dev/kvm"
# Where the dynamic loader looks without its cache (`ld.so --help`, x86_64 Debian).
_LOADER_DIRS = frozenset(
    (
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib",
        "/usr/lib",
        "/lib64",
        "/usr/lib64",
    )
)


def _loaded_libraries(path: str) -> list[str]:
    """What the dynamic loader maps for path (ldd: the interpreter and every library)."""
    out = subprocess.run(
        ["ldd", path], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    found = []
    for line in out.splitlines():
        m = re.search(r"(/\S+)", line.split("=>")[-1])
        if m:
            found.append(m.group(1))
    return found


@functools.cache
def root_files(qemu_binary: str) -> tuple[str, ...] | None:
    """The host files QEMU's root holds, at the same paths: the binary, its libraries, its TCG
    module with theirs, its microvm firmware and two devices (/dev/kvm is added under KVM by
    jail_options); None when they cannot be listed (no ldd): QEMU then sees the host's tree,
    read-only, and the layer says so."""
    if not shutil.which("ldd"):
        return None
    files = [qemu_binary, *_loaded_libraries(qemu_binary)]
    # QEMU finds its modules and firmware relative to its own path (/proc/self/exe).
    prefix = os.path.normpath(os.path.join(os.path.dirname(qemu_binary), ".."))
    module_dirs = [
        os.path.join(prefix, "lib", "x86_64-linux-gnu", "qemu"),
        os.path.join(prefix, "lib", "qemu"),
    ]
    for module_dir in module_dirs:
        for name in ("accel-tcg-x86_64.so",):
            module = os.path.join(module_dir, name)
            if os.path.isfile(module):
                files += [module, *_loaded_libraries(module)]
    for name in _FIRMWARE:
        firmware = os.path.join(prefix, "share", "qemu", name)
        if os.path.exists(firmware):
            files.append(firmware)
    files += [d for d in _DEVICES if os.path.exists(d)]
    # The loader in QEMU's root has no /etc/ld.so.cache, and searches only its built-in
    # directories: a library elsewhere (an ld.so.conf directory such as /usr/local/lib) needs
    # the cache, which is then the one file of /etc QEMU gets.
    if any(
        os.path.dirname(f) not in _LOADER_DIRS
        for f in files
        if ".so" in os.path.basename(f) and "/qemu/" not in f
    ) and os.path.exists("/etc/ld.so.cache"):
        files.append("/etc/ld.so.cache")
    unique = []
    for f in files:
        if f not in unique and os.path.exists(f):
            unique.append(f)
    return tuple(unique)


@functools.cache
def seccomp_policy(qemu_binary: str) -> tuple[str, str]:
    """("allow" or "deny" or "log", why) for QEMU's host filter: the allow-list when this QEMU's
    version is one it was measured on, else the deny-list (logged once as a warning).
    $EXEC_SANDBOX_SECCOMP=allow|deny|log overrides ("log": the allow-list, logging instead of
    refusing what it lacks: how it is measured for a new QEMU)."""
    forced = os.environ.get(SECCOMP_ENV, "").strip()
    if forced:
        if forced not in ("allow", "deny", "log"):
            raise VmConfigError(f"{SECCOMP_ENV} must be allow, deny or log, got {forced!r}")
        return forced, f"{SECCOMP_ENV}={forced}"
    try:
        first = subprocess.run(
            [qemu_binary, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as exc:
        return "deny", f"cannot ask {qemu_binary} its version ({exc}): the deny-list"
    m = re.search(r"version (\d+\.\d+)", first[0] if first else "")
    version = m.group(1) if m else "unknown"
    if version in MEASURED_QEMU_VERSIONS:
        return "allow", f"QEMU {version}: measured"
    return "deny", (
        f"QEMU {version} is not one the allow-list was measured on "
        f"({', '.join(MEASURED_QEMU_VERSIONS)}): the deny-list instead"
    )


def prepare_host(qemu_binary: str) -> None:
    """Everything jail_options needs that runs a program (ldd, qemu --version), once, off the
    event loop (the scheduler's start runs it in a thread)."""
    root_files(qemu_binary)
    seccomp_policy(qemu_binary)
    _warn_once()


def _warn_once() -> None:
    user, why = qemu_identity()
    if opted_out():
        _report_once("user", f"opt-out: {why}", logging.WARNING)
    elif user == FALLBACK_QEMU_IDS and why.startswith("no user"):
        _report_once("user", why, logging.WARNING)


def _report_once(layer: str, detail: str, level: int) -> None:
    key = (layer, detail)
    if key not in _reported:
        _reported.add(key)
        log.log(level, "host jail: %s: %s", layer, detail)


def jail_options(
    memory_mb: int,
    vcpus: int = 1,
    network: bool = False,
    *,
    qemu_binary: str,
    accel: str = "tcg",
    seccomp: str | None = None,
) -> dict[str, Any]:
    """The jail dict for _execsbx.Vm: cgroup limits derived from the guest's size, QEMU's user
    and groups (/dev/kvm's under KVM), its root's files (with /dev/kvm under KVM) and the seccomp
    policy for qemu_binary (seccomp given: that policy, e.g. for a stand-in that is not QEMU)."""
    options: dict[str, Any] = {
        "network": int(network),
        "memory_mb": memory_mb + QEMU_MEMORY_OVERHEAD_MB,
        "cpu_percent": vcpus * CPU_PERCENT_PER_VCPU + CPU_PERCENT_MAIN_LOOP,
        "pids_max": QEMU_PIDS_MAX,
    }
    user, _ = qemu_identity()
    if user is not None:
        options["uid"], options["gid"] = user
        options["groups"] = kvm_groups() if accel == "kvm" else []
    files = root_files(qemu_binary)
    if files is not None:
        options["root"] = list(files)
        if accel == "kvm" and os.path.exists(KVM_DEVICE):
            options["root"].append(KVM_DEVICE)
    if seccomp:
        options["seccomp"] = seccomp  # the caller's choice, and its to report
    else:
        policy, why = seccomp_policy(qemu_binary)
        options["seccomp"] = policy
        if policy != "allow":
            _report_once("seccomp", why, logging.WARNING)
    _warn_once()
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
