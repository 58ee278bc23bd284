"""The host jail's configuration surface, without a VM: QEMU's -sandbox option, the seccomp
policy's data, the jail dict's validation, the limits derived from a VM's size, the user option,
and `sbx doctor` (which probes the layers with a stand-in process, not QEMU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exec_sandbox import _execsbx
from exec_sandbox.errors import VmConfigError
from exec_sandbox.vm.jail import (
    QEMU_MEMORY_OVERHEAD_MB,
    QEMU_USER_ENV,
    jail_options,
    opted_out,
    qemu_identity,
    qemu_user,
    root_files,
    usage_figures,
)

ARGV = dict(
    qemu_binary="/usr/bin/qemu-system-x86_64",
    kernel="/k",
    rootfs="/r",
    memory_mb=192,
    vcpus=1,
    accel="tcg",
)


def test_qemu_sandbox_option_denies_spawn_privileges_and_resource_control() -> None:
    argv = _execsbx.build_qemu_argv(**ARGV, qemu_sandbox=True)
    value = argv[argv.index("-sandbox") + 1].split(",")
    assert value[0] == "on"
    assert {"obsolete=deny", "elevateprivileges=deny", "spawn=deny", "resourcecontrol=deny"} <= set(
        value[1:]
    )
    assert "-sandbox" not in _execsbx.build_qemu_argv(**ARGV)


def test_seccomp_deny_list_has_a_reason_for_every_rule() -> None:
    rules = _execsbx.seccomp_rules("deny")
    names = {name for name, _, _ in rules}
    assert {
        "ptrace",
        "mount",
        "kexec_load",
        "init_module",
        "bpf",
        "unshare",
        "setns",
        "keyctl",
        "process_vm_readv",
        "open_by_handle_at",
    } <= names
    for name, err, reason in rules:
        assert err in ("EPERM", "ENOSYS"), name
        assert len(reason) > 10, name


def test_seccomp_allow_list_has_a_reason_for_every_call_and_lacks_the_dangerous_ones() -> None:
    rules = _execsbx.seccomp_rules()
    assert rules == _execsbx.seccomp_rules("allow")
    names = {name for name, _, _ in rules}
    assert {"read", "ppoll", "mmap", "futex", "recvmsg", "execve", "ioctl", "clone"} <= names
    assert (
        not {
            "socket",
            "connect",
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "bpf",
            "io_uring_setup",
            "unlink",
            "kill",
            "keyctl",
        }
        & names
    )
    for name, action, reason in rules:
        assert action == "ALLOW" or action.startswith("ALLOW IF"), name
        assert len(reason) > 10, name
    with pytest.raises(ValueError):
        _execsbx.seccomp_rules("maybe")


@pytest.mark.parametrize(
    "jail, error",
    [
        ({"bogus": 1}, TypeError),
        ({"memory_mb": -1}, ValueError),
        ({"uid": -2}, ValueError),
        ({"network": "yes"}, TypeError),
        ({"seccomp": "none"}, ValueError),
        ({"groups": [-1]}, ValueError),
        ({"groups": "kvm"}, TypeError),
        ({"root": "/usr/bin"}, TypeError),
        ([], TypeError),
    ],
)
def test_jail_dict_is_validated_before_anything_starts(jail: object, error: type) -> None:
    with pytest.raises(error):
        _execsbx.Vm(**ARGV, jail=jail)


def test_jail_options_follow_the_vm_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(QEMU_USER_ENV, raising=False)
    options = jail_options(512, vcpus=2, qemu_binary="/bin/true")
    assert options["memory_mb"] == 512 + QEMU_MEMORY_OVERHEAD_MB
    assert options["cpu_percent"] == 250
    assert options["network"] == 0
    assert jail_options(128, network=True, qemu_binary="/bin/true")["network"] == 1


def test_a_root_callers_qemu_gets_a_user_unless_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(QEMU_USER_ENV, raising=False)
    options = jail_options(128, qemu_binary="/bin/true")
    if os.geteuid() == 0:
        assert options["uid"] not in (None, 0) and options["gid"] not in (None, 0)
        assert isinstance(options["groups"], list)
    else:
        assert "uid" not in options  # an unprivileged caller's QEMU keeps its uid
    monkeypatch.setenv(QEMU_USER_ENV, "root")
    assert opted_out()
    assert "uid" not in jail_options(128, qemu_binary="/bin/true")
    user, why = qemu_identity()
    assert user is None and "opt-out" in why


def test_qemus_root_lists_the_binary_its_libraries_and_devices() -> None:
    files = root_files("/bin/true")
    assert files is not None
    assert files[0] == "/bin/true"
    assert any("libc.so" in f for f in files)
    assert "/dev/null" in files and "/dev/urandom" in files
    assert "/dev/kvm" not in files  # only under KVM:
    tcg = jail_options(128, qemu_binary="/bin/true", accel="tcg")
    assert "/dev/kvm" not in tcg["root"] and tcg.get("groups", []) == []
    if os.path.exists("/dev/kvm"):
        assert "/dev/kvm" in jail_options(128, qemu_binary="/bin/true", accel="kvm")["root"]
    assert not [f for f in files if f.startswith(("/etc", "/home", "/root"))]


def test_qemu_user_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(QEMU_USER_ENV, "nobody")
    uid, gid = qemu_user() or (None, None)
    assert uid == 65534 and gid == 65534
    monkeypatch.setenv(QEMU_USER_ENV, "no-such-user-sbx")
    with pytest.raises(VmConfigError):
        qemu_user()


def test_usage_figures_round_memory_up_and_keep_unknowns() -> None:
    assert usage_figures(None) == (None, None)
    assert usage_figures((2_500_000, 1)) == (2, 1)
    assert usage_figures((None, 3 * 1024 * 1024)) == (None, 3)


@pytest.mark.skipif(os.geteuid() != 0, reason="the layers need root (cgroups, namespaces)")
def test_doctor_reports_each_layer_and_why() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli.main", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    for layer in ("seccomp", "namespaces", "cgroup", "rlimits", "root", "user"):
        assert checks[f"jail: {layer}"]["ok"], checks[f"jail: {layer}"]
    assert "no capabilities" in checks["jail: user"]["detail"]
    assert "allow-list" in checks["jail: seccomp"]["detail"]
    assert checks["jail: seccomp policy"]["ok"], checks["jail: seccomp policy"]
    assert {"accelerator", "qemu", "qemu -sandbox", "images"} <= set(checks)


@pytest.mark.skipif(os.geteuid() != 0, reason="the opt-out is a root caller's")
def test_doctor_warns_about_the_opt_out() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli.main", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, QEMU_USER_ENV: "root"},
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    user = checks["jail: qemu user"]
    assert not user["ok"] and "WARNING" in user["detail"] and "uid 0" in user["detail"]
    assert not checks["jail: user"]["ok"]  # the C core's view: uid 0 kept


def test_setup_creates_the_qemu_user_as_a_system_user(monkeypatch: pytest.MonkeyPatch) -> None:
    from exec_sandbox.vm import jail

    calls: list[list[str]] = []

    def no_such_user(name: str) -> object:
        raise KeyError(name)

    monkeypatch.setattr(jail.pwd, "getpwnam", no_such_user)
    monkeypatch.setattr(jail.os, "geteuid", lambda: 0)
    monkeypatch.setattr(jail.subprocess, "run", lambda argv, **_: calls.append(argv) or None)
    assert jail.ensure_qemu_user() == "user sbx-qemu: created"
    (argv,) = calls
    assert argv[-1] == "sbx-qemu"
    assert {"--system", "--user-group", "--no-create-home"} <= set(argv)
    assert argv[argv.index("--shell") + 1] == "/usr/sbin/nologin"
    jail._default_user.cache_clear()


def test_a_library_outside_the_loaders_own_directories_brings_the_loader_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exec_sandbox.vm import jail

    real = jail._loaded_libraries("/bin/true")
    assert "/etc/ld.so.cache" not in (jail.root_files.__wrapped__("/bin/true") or ())
    if not os.path.exists("/etc/ld.so.cache"):
        pytest.skip("no loader cache on this host")
    monkeypatch.setattr(
        jail, "_loaded_libraries", lambda path: [*real, "/usr/local/lib/libsbx-probe.so.1"]
    )
    monkeypatch.setattr(jail.os.path, "exists", lambda p: True)
    assert "/etc/ld.so.cache" in (jail.root_files.__wrapped__("/bin/true") or ())
