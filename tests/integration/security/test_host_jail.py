"""The host jail around QEMU, proven from outside while a real VM runs user code: QEMU's
/proc/PID shows the seccomp filters (the allow-list) and no_new_privs, an unprivileged uid without
capabilities when the caller is root, a root holding only its own files, namespaces that differ
from ours, a cgroup with the limits, the jail's rlimits and mount tree; after the run the cgroup is
gone and its figures are in the result. (The policies themselves, syscall by syscall, are tested in
tests/c/test_seccomp.c; here a probe process under the same jail shows a call outside the
allow-list refused.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from exec_sandbox import Scheduler
from exec_sandbox.models import ExecutionResult
from exec_sandbox.vm import host_facts, workspace
from exec_sandbox.vm.binding import probe_jail, seccomp_rules
from exec_sandbox.vm.jail import (
    CPU_PERCENT_MAIN_LOOP,
    CPU_PERCENT_PER_VCPU,
    QEMU_MEMORY_OVERHEAD_MB,
    QEMU_PIDS_MAX,
    QEMU_USER_ENV,
    jail_options,
    root_files,
    seccomp_policy,
)
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm

MEMORY_MB = 160


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


async def _inspect_running_qemu(
    scheduler: Scheduler, probe: Callable[[int], object]
) -> tuple[object, ExecutionResult]:
    """Run code that waits; once it has printed, QEMU is fully up (its own -sandbox filter is
    installed before the guest boots): call probe(qemu_pid) and return what it returned."""
    up = asyncio.Event()

    def on_stdout(text: str) -> None:
        if "up" in text:
            up.set()

    task = asyncio.create_task(
        scheduler.run(
            "import time; print('up', flush=True); time.sleep(3)",
            memory_mb=MEMORY_MB,
            on_stdout=on_stdout,
        )
    )
    try:
        await asyncio.wait_for(up.wait(), 60)
        pids = qemu_processes(parent=os.getpid())
        assert len(pids) == 1, pids
        seen = probe(pids[0])
    finally:
        result = await task
    return seen, result


async def test_qemu_runs_under_seccomp_filters_and_no_new_privs(scheduler: Scheduler) -> None:
    status, result = await _inspect_running_qemu(scheduler, _status)
    assert isinstance(status, dict)
    assert result.exit_code == 0
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # filter mode
    # Ours (the host jail's allow-list) and QEMU's own (-sandbox on): both stay in force.
    assert int(status["Seccomp_filters"]) >= 2


async def test_qemu_runs_under_the_seccomp_allow_list(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allow-list is the policy in force for this host's QEMU (the deny-list is only the
    fallback for a QEMU it was not measured on), and the whole VM ran under it."""
    monkeypatch.delenv("EXEC_SANDBOX_SECCOMP", raising=False)
    policy, why = seccomp_policy(host_facts.qemu_binary())
    assert policy == "allow", why
    rules = {name: action for name, action, _ in seccomp_rules(policy)}
    assert rules["ppoll"] == "ALLOW" and rules["ioctl"].startswith("ALLOW IF")
    assert not {"socket", "connect", "ptrace", "mount", "io_uring_setup", "unshare"} & set(rules)
    status, result = await _inspect_running_qemu(scheduler, _status)
    assert isinstance(status, dict) and result.exit_code == 0
    assert status["Seccomp"] == "2"


def test_a_call_outside_the_allow_list_is_refused_in_a_probe_process(tmp_path: Path) -> None:
    """A probe (a shell script, in a root of its own) spawned under the jail QEMU gets: the shell
    starts and runs under the allow-list, and kill(2), which is not on it, fails; under the
    deny-list the same call works, so the allow-list is what refused it."""
    if not os.path.exists("/bin/sh"):
        pytest.skip("no /bin/sh for the probe")

    def probe(script: str, policy: str) -> tuple[int | None, list[tuple[str, bool, str]]]:
        path = tmp_path / f"probe-{policy}-{abs(hash(script))}"
        path.write_text(f"#!/bin/sh\n{script}\n")  # QEMU's arguments land in $@, unused
        path.chmod(0o755)
        options = jail_options(64, qemu_binary="/bin/sh", seccomp=policy)
        options["root"] = [*(root_files("/bin/sh") or ()), str(path)]
        return probe_jail(str(path), options)

    on_list, layers = probe("cd / && exit 0 || exit 1", "allow")
    assert on_list == 0, layers
    refused, layers = probe("kill -0 $$ 2>/dev/null && exit 0 || exit 1", "allow")
    assert refused == 1, layers
    assert any(layer == "seccomp" and "allow-list" in detail for layer, _, detail in layers)
    allowed, _ = probe("kill -0 $$ 2>/dev/null && exit 0 || exit 1", "deny")
    assert allowed == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a root caller's QEMU is the one that changes uid")
async def test_a_root_callers_qemu_is_unprivileged_and_has_no_capabilities(
    scheduler: Scheduler,
) -> None:
    assert os.environ.get(QEMU_USER_ENV, "") not in ("root", "0"), "opted out: nothing to test"
    status, result = await _inspect_running_qemu(scheduler, _status)
    assert isinstance(status, dict) and result.exit_code == 0
    uids = status["Uid"].split()
    gids = status["Gid"].split()
    assert len(set(uids)) == 1 and uids[0] != "0", uids  # real, effective, saved, fs
    assert len(set(gids)) == 1 and gids[0] != "0", gids
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert "0" not in status.get("Groups", "").split()


async def test_qemus_root_holds_only_its_own_files(scheduler: Scheduler) -> None:
    """QEMU's / is a tmpfs holding its binary, libraries, module, firmware and three devices
    (at their host paths) and its /proc; the host's /etc, /home, /root, /tmp are not there, and
    reading /etc/shadow from inside its mount namespace fails."""

    def view(pid: int) -> dict[str, object]:
        root = f"/proc/{pid}/root"
        # Every file below the root, as QEMU sees it (/proc aside).
        seen = set()
        for top, dirs, files in os.walk(root):
            if top == root:
                dirs[:] = [d for d in dirs if d != "proc"]
            seen.update(os.path.join(top, f)[len(root) :] for f in files)
        return {
            "entries": sorted(os.listdir(root)),
            "files": seen,
            "shadow": _read_in_mount_namespace(pid, "/etc/shadow"),
            "mountinfo": Path(f"/proc/{pid}/mountinfo").read_text(),
        }

    seen, result = await _inspect_running_qemu(scheduler, view)
    assert isinstance(seen, dict) and result.exit_code == 0
    qemu = host_facts.qemu_binary()
    expected = set(jail_options(64, qemu_binary=qemu, accel=host_facts.accelerator())["root"])
    assert expected, "no root plan for this QEMU"
    # /dev/kvm only under KVM
    assert ("/dev/kvm" in expected) == (host_facts.accelerator() == "kvm")
    assert seen["files"] == expected, seen["files"] ^ expected
    tops = {p.split("/")[1] for p in expected} | {"proc"}
    assert set(seen["entries"]) == tops  # type: ignore[arg-type]
    assert not {"etc", "home", "root", "tmp", "var", "sys"} & set(seen["entries"])  # type: ignore[arg-type]
    assert seen["shadow"] == "ENOENT", seen["shadow"]
    # The root is a tmpfs, and every mount of the tree is read-only.
    mounts = [line.split() for line in str(seen["mountinfo"]).splitlines()]
    root_mount = next(m for m in mounts if m[4] == "/")
    assert root_mount[root_mount.index("-") + 1] == "tmpfs"


_READ_IN_NAMESPACE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
# setns(CLONE_NEWNS): root and cwd become the namespace's (os.setns is Python 3.12+).
if libc.setns(os.open(sys.argv[1], os.O_RDONLY), 0x00020000) != 0:
    sys.exit("setns: " + os.strerror(ctypes.get_errno()))
try:
    fd = os.open(sys.argv[2], os.O_RDONLY)
    print("read", len(os.read(fd, 64)))
except OSError as exc:
    print(errno.errorcode.get(exc.errno or 0, "?"))
"""


def _read_in_mount_namespace(pid: int, path: str) -> str:
    """Open path from inside pid's mount namespace (a single-threaded helper that setns()es into
    it, and so gets its root): how many bytes it read, or the errno name it failed with."""
    out = subprocess.run(
        [sys.executable, "-c", _READ_IN_NAMESPACE, f"/proc/{pid}/ns/mnt", path],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.stdout.strip() or out.stderr.strip()


async def test_qemu_holds_no_fd_of_the_caller(scheduler: Scheduler, tmp_path: Path) -> None:
    # The spawn closes every fd but QEMU's own (channel, console, QMP, RAM, net port): an fd the
    # caller left inheritable must not reach the jailed QEMU. (tests/unit/test_execsbx_contract.py
    # checks the fd layout with a stand-in; this is the real QEMU.)
    marker = tmp_path / "caller-secret"
    marker.write_text("not for QEMU")
    leaked = os.open(marker, os.O_RDONLY)
    os.set_inheritable(leaked, True)

    def targets(pid: int) -> list[str]:
        fd_dir = f"/proc/{pid}/fd"
        return [os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)]

    try:
        seen, result = await _inspect_running_qemu(scheduler, targets)
    finally:
        os.close(leaked)
    assert isinstance(seen, list) and result.exit_code == 0
    assert len(seen) > 3  # QEMU's own fds are there: the listing worked
    assert not [t for t in seen if "caller-secret" in t], seen


async def test_qemu_namespaces_differ_from_the_callers(scheduler: Scheduler) -> None:
    kinds = ("mnt", "pid", "net", "uts", "ipc")

    def namespaces(pid: int) -> dict[str, tuple[str, str]]:
        return {
            k: (os.readlink(f"/proc/{pid}/ns/{k}"), os.readlink(f"/proc/self/ns/{k}"))
            for k in kinds
        }

    seen, _ = await _inspect_running_qemu(scheduler, namespaces)
    assert isinstance(seen, dict)
    for kind, (qemu_ns, ours) in seen.items():
        assert qemu_ns != ours, kind


async def test_qemu_is_pid_1_of_its_pid_namespace_and_sees_only_itself(
    scheduler: Scheduler,
) -> None:
    def view(pid: int) -> tuple[str, list[str], str]:
        nspid = _status(pid)["NSpid"]
        # /proc as mounted in QEMU's mount namespace (reached through its root).
        procs = [p for p in os.listdir(f"/proc/{pid}/root/proc") if p.isdigit()]
        return nspid, procs, Path(f"/proc/{pid}/mountinfo").read_text()

    seen, _ = await _inspect_running_qemu(scheduler, view)
    assert isinstance(seen, tuple)
    nspid, procs, mountinfo = seen
    assert nspid.split() == [nspid.split()[0], "1"]
    assert procs == ["1"]
    mounts = [line.split() for line in mountinfo.splitlines()]
    # Private (no "shared:N" propagation to or from the host) and read-only, every mount.
    assert all(not any(f.startswith("shared:") for f in m) for m in mounts), mountinfo
    assert all(m[5].split(",")[0] == "ro" for m in mounts), mountinfo


async def test_qemu_cgroup_has_the_limits_and_is_removed_after(scheduler: Scheduler) -> None:
    def cgroup(pid: int) -> dict[str, str]:
        found = {}
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(","):
                found[c or "unified"] = path
        return found

    def limits(pid: int) -> dict[str, object]:
        paths = cgroup(pid)
        ours = cgroup(os.getpid())
        root = Path("/sys/fs/cgroup")
        if (root / "memory").is_dir() and paths.get("memory", "/") != ours.get("memory"):
            mem_dir = root / "memory" / paths["memory"].lstrip("/")
            return {
                "memory": int((mem_dir / "memory.limit_in_bytes").read_text()),
                "pids": (root / "pids" / paths["pids"].lstrip("/") / "pids.max")
                .read_text()
                .strip(),
                "cpu": int(
                    (root / "cpu" / paths["cpu"].lstrip("/") / "cpu.cfs_quota_us").read_text()
                ),
                "dirs": [mem_dir, root / "pids" / paths["pids"].lstrip("/")],
            }
        v2 = root / paths["unified"].lstrip("/")
        return {
            "memory": int((v2 / "memory.max").read_text()),
            "pids": (v2 / "pids.max").read_text().strip(),
            "cpu": int((v2 / "cpu.max").read_text().split()[0]),
            "dirs": [v2],
        }

    seen, result = await _inspect_running_qemu(scheduler, limits)
    assert isinstance(seen, dict)
    assert seen["memory"] == (MEMORY_MB + QEMU_MEMORY_OVERHEAD_MB) * 1024 * 1024
    assert seen["pids"] == str(QEMU_PIDS_MAX)
    assert seen["cpu"] == (CPU_PERCENT_PER_VCPU + CPU_PERCENT_MAIN_LOOP) * 1000
    dirs = seen["dirs"]
    assert isinstance(dirs, list)
    # Removed off the loop after the VM is retired; by the time close() returns at the latest.
    await scheduler.close()
    assert all(not d.exists() for d in dirs), "the VM's cgroup outlived its scheduler"
    # The host-side figures come from that cgroup.
    assert result.external_cpu_time_ms is not None and result.external_cpu_time_ms > 0
    assert result.external_memory_peak_mb is not None
    assert 0 < result.external_memory_peak_mb <= MEMORY_MB + QEMU_MEMORY_OVERHEAD_MB


async def test_qemu_rlimits(scheduler: Scheduler) -> None:
    def limits(pid: int) -> dict[str, list[str]]:
        rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
        return {r[:26].strip(): r[26:].split()[:2] for r in rows}

    seen, _ = await _inspect_running_qemu(scheduler, limits)
    assert isinstance(seen, dict)
    assert seen["Max core file size"] == ["0", "0"]
    # Its one writable disk is its work disk: no file grows past that disk's size and the tables
    # a qcow2 overlay of it would add (a fork moves a VM onto one).
    disk = str(workspace.max_file_bytes(scheduler.config.default_disk_mb))
    assert int(disk) < (scheduler.config.default_disk_mb << 20) * 1.01
    assert seen["Max file size"] == [disk, disk]
    assert seen["Max open files"] == ["1024", "1024"]


async def test_memory_heavy_guest_is_counted_against_qemus_cgroup(scheduler: Scheduler) -> None:
    """The guest's memory is QEMU's memory on the host: a guest that touches 100 MiB shows up in
    the cgroup's peak, which the limit caps."""
    small = await scheduler.run("print(1)", memory_mb=MEMORY_MB)
    big = await scheduler.run(
        "b = bytearray(100 * 1024 * 1024); print(len(b))", memory_mb=MEMORY_MB
    )
    assert big.stdout == f"{100 * 1024 * 1024}\n"
    assert small.external_memory_peak_mb is not None and big.external_memory_peak_mb is not None
    assert big.external_memory_peak_mb >= small.external_memory_peak_mb + 60
    assert big.external_memory_peak_mb <= MEMORY_MB + QEMU_MEMORY_OVERHEAD_MB


async def test_cgroups_left_by_a_killed_caller_are_swept(scheduler: Scheduler) -> None:
    """A SIGKILLed caller cannot remove its VMs' cgroups (QEMU dies with it, they are empty):
    the next VM on the host removes siblings named after a pid that no longer exists."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    probe = await scheduler.run("print(1)")  # find where this host puts VM cgroups
    assert probe.external_cpu_time_ms is not None
    parents = _vm_cgroup_parents()
    stale = [p / f"sbx-{dead.pid}-0" for p in parents]
    for d in stale:
        d.mkdir()
    await scheduler.run("print(2)")
    assert [d for d in stale if d.exists()] == []


def _vm_cgroup_parents() -> list[Path]:
    """The directories VM cgroups are made in: this process's own cgroup in each hierarchy."""
    root = Path("/sys/fs/cgroup")
    parents = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",")
        if {"memory", "cpu", "cpuacct", "pids"} & set(names):
            base = root / names[0] if (root / names[0]).is_dir() else None
            if base is not None:
                parents.append(base / path.lstrip("/"))
    if not parents:
        _, _, path = Path("/proc/self/cgroup").read_text().splitlines()[-1].split(":", 2)
        parents.append(root / path.lstrip("/"))
    return parents
