"""`sbx doctor`: one screen on what this host provides — the accelerator, QEMU, the guest images,
what `sbx setup` needs to build them, and each layer of the host jail — and, for whatever is
missing, why and the fix.

Every jail layer is checked by doing it, not by reading configuration: a stand-in process
(/bin/true) is spawned exactly as QEMU would be, and the C core reports which layers it could put
in force and why the others are off."""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass

from ..errors import SandboxError
from ..images import builder
from ..images.catalog import load_images
from ..paths import images_dir
from ..templates.oci import skopeo_problem
from ..vm import host_facts, workspace
from ..vm.binding import probe_jail, seccomp_rules
from ..vm.jail import (
    QEMU_USER_ENV,
    jail_options,
    kvm_problem,
    opted_out,
    qemu_identity,
    seccomp_policy,
)

_STAND_IN = "/bin/true"
_SANDBOX_OPTION = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True  # False: the sandbox runs without it, with less defence in depth


def _accelerator() -> Check:
    forced = os.environ.get("EXEC_SANDBOX_ACCEL")
    try:
        accel = host_facts.accelerator()
    except SandboxError as exc:
        return Check("accelerator", False, str(exc))
    if forced:
        return Check("accelerator", True, f"{accel} (forced by EXEC_SANDBOX_ACCEL)")
    if accel == "kvm":
        return Check("accelerator", True, "kvm (hardware virtualisation)")
    reason = host_facts._kvm_unusable_reason() or "KVM probe failed"
    return Check("accelerator", True, f"tcg, software emulation: slower. KVM unusable: {reason}")


def _qemu() -> list[Check]:
    try:
        binary = host_facts.qemu_binary()
    except SandboxError as exc:
        return [Check("qemu", False, str(exc))]
    try:
        version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.splitlines()[0]
        help_text = subprocess.run(
            [binary, "-help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return [Check("qemu", False, f"{binary}: cannot run it: {exc}")]
    checks = [Check("qemu", True, f"{binary}: {version}")]
    if "-sandbox" in help_text:
        checks.append(
            Check(
                "qemu -sandbox",
                True,
                f"QEMU's own seccomp filter: -sandbox {_SANDBOX_OPTION}",
                required=False,
            )
        )
    else:
        checks.append(
            Check(
                "qemu -sandbox",
                False,
                "this QEMU was built without seccomp support",
                required=False,
            )
        )
    return checks


def _images() -> Check:
    where = images_dir()
    try:
        images = load_images(where)
    except SandboxError as exc:
        return Check("images", False, str(exc))
    return Check(
        "images", True, f"{where}: kernel {images.kernel.name}, rootfs {images.rootfs.name}"
    )


def _jail_layers() -> list[Check]:
    """Spawn the stand-in under the full jail and report each layer as the C core saw it."""
    if not os.path.exists(_STAND_IN):
        return [Check("host jail", False, f"{_STAND_IN} missing: cannot probe", required=False)]
    try:
        qemu: str | None = host_facts.qemu_binary()
    except SandboxError:
        qemu = None
    try:
        # The stand-in runs under the policy QEMU would get.
        policy, why = seccomp_policy(qemu) if qemu else ("allow", "no QEMU to ask")
        accel = host_facts.accelerator() if qemu else "tcg"
        options = jail_options(128, qemu_binary=_STAND_IN, accel=accel, seccomp=policy)
        status, layers = probe_jail(_STAND_IN, options)
    except (OSError, SandboxError) as exc:
        return [Check("host jail", False, f"cannot start a jailed process: {exc}")]
    checks = [
        Check(f"jail: {layer}", bool(active), detail, required=False)
        for layer, active, detail in layers
    ]
    if status != 0:
        checks.append(Check("jail: entry", False, f"the jailed stand-in exited with {status}"))
    user, who = qemu_identity()
    if opted_out():
        checks.append(
            Check(
                "jail: qemu user",
                False,
                f"WARNING: {who}. A QEMU escape is then root on this host, with every "
                f"capability; unset {QEMU_USER_ENV} to give it sbx-qemu",
                required=False,
            )
        )
    else:
        checks.append(
            Check(
                "jail: qemu user",
                user is None or not who.startswith("no user"),
                who if user is None else f"uid {user[0]}, gid {user[1]}: {who}",
                required=False,
            )
        )
    rules = seccomp_rules(policy)
    if policy == "deny":
        checks.append(
            Check(
                "jail: seccomp policy",
                False,
                f"WARNING: the deny-list fallback ({len(rules)} calls denied): {why}",
                required=False,
            )
        )
    else:
        checks.append(
            Check(
                "jail: seccomp policy",
                policy == "allow",
                f"allow-list of {len(rules)} calls ({why}); every other call fails with "
                "ENOSYS" + (" (log mode: logged, not refused)" if policy == "log" else ""),
                required=False,
            )
        )
    return checks


def _kvm_access() -> Check:
    """KVM is used only if this user can open /dev/kvm: on Debian, members of the kvm group."""
    if not os.path.exists("/dev/kvm"):
        return Check(
            "kvm access",
            False,
            "no /dev/kvm on this host (no hardware virtualisation exposed): VMs run under TCG",
            required=False,
        )
    problem = kvm_problem()
    if problem:
        return Check("kvm access", False, problem, required=False)
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Check("kvm access", True, "/dev/kvm is readable and writable", required=False)
    user = builder._user_name()
    return Check(
        "kvm access",
        False,
        f"/dev/kvm is not open to {user}: sudo usermod -aG kvm "
        f"{user}, then log in again (VMs run under the slower TCG until then)",
        required=False,
    )


def _setup_checks(images_ready: bool) -> list[Check]:
    """What `sbx setup` needs, each missing piece with its fix. Required only while there are no
    images yet (with images, nothing needs to be built)."""
    checks = []
    missing = builder.missing_packages()
    for what, package in missing:
        checks.append(
            Check(
                f"setup: {package}",
                False,
                f"{what}: {builder.apt_install_line([package])}",
                required=not images_ready,
            )
        )
    if not missing:
        checks.append(
            Check(
                "setup: build tools",
                True,
                "every tool `sbx setup` runs is installed",
                required=not images_ready,
            )
        )
    if os.geteuid() != 0:
        problem = builder.user_namespace_problem()
        checks.append(
            Check(
                "setup: user namespaces",
                problem is None,
                problem or "an unprivileged build can make its user namespace",
                required=not images_ready,
            )
        )
    where = images_dir()
    free = builder.free_bytes(where)
    need = builder.FULL_BUILD_BYTES
    enough = free >= need
    detail = (
        f"{free / 1024**3:.1f} GB free for {where}; a build from nothing needs about "
        f"{need // 1024**3} GB"
    )
    if not enough:
        detail += ": free some space or set EXEC_SANDBOX_IMAGES_DIR to a larger disk"
    checks.append(Check("setup: disk space", enough, detail, required=not images_ready))
    return checks


def _skopeo() -> Check:
    """Templates built from a container image import it with skopeo; nothing else needs it."""
    problem = skopeo_problem()
    return Check(
        "templates: skopeo",
        problem is None,
        problem or "container images can be imported for templates",
        required=False,
    )


def _qemu_img() -> Check:
    """Forks put each VM on a qcow2 overlay of the parent's frozen work disk, made by qemu-img;
    without it they copy the disk (slower the more it holds, same result)."""
    ok = workspace.overlays_available()
    return Check(
        "forks: qemu-img",
        ok,
        "forks are copy-on-write (qcow2 overlays)"
        if ok
        else "not found (install qemu-utils): forks copy the work disk",
        required=False,
    )


def run_checks() -> list[Check]:
    images = _images()
    return [
        _accelerator(),
        _kvm_access(),
        *_qemu(),
        images,
        *_setup_checks(images.ok),
        _skopeo(),
        _qemu_img(),
        *_jail_layers(),
    ]


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        mark = "ok " if c.ok else ("MISSING" if c.required else "off")
        lines.append(f"{c.name.ljust(width)}  {mark:<7}  {c.detail}")
    return "\n".join(lines)


def as_dicts(checks: list[Check]) -> list[dict[str, object]]:
    return [asdict(c) for c in checks]


def healthy(checks: list[Check]) -> bool:
    """Everything required to run code is there (optional layers may be off)."""
    return all(c.ok for c in checks if c.required)
