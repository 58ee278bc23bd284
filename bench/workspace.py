"""The work disk (docs/design.md, "Workspace"), all in one run on this machine:

1. a 1 GiB file written (dd from /dev/zero, fsync'd) and read back in a default session,
   against the same dd on the host, into a file on the cache's file system (one run each);
2. a VM's start with a work disk against one without, same configuration otherwise, the two
   interleaved: a cold boot (what the guest's mke2fs costs) and an L1 restore (the copy of the
   snapshot's disk each clone gets);
3. fork(1) of a VM without a disk, with a fresh one and with 256 MiB written on it. A parent's
   first fork freezes its disk under qcow2 overlays (copy on write: the parent's and the copy's);
   a parent forked before copies its overlay (what it wrote since) onto the same frozen disk.
   The first fork of each parent is its own row ("first"), the later ones another. Then the
   first fork of a parent with --written-mb written (256 MiB), copy on write against the copy
   made without qemu-img (`workspace.overlays_available` off), a new parent each, the two
   interleaved: same RAM state, so the difference is the disk's alone (the written parent's page
   cache makes its stream longer than a fresh VM's, which the rows above compare it with).

Cells: p50 (p95) ms; the ratio is with / without. VMs are started through the provisioner (the
scheduler's own path, admission aside) so that "without" exists at all: every call of the
public API gets a disk.

    .venv/bin/python bench/workspace.py --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import config, percentile

from exec_sandbox import Scheduler
from exec_sandbox.provisioning.provisioner import Phases
from exec_sandbox.snapshots.forks import fork_vms
from exec_sandbox.vm import workspace
from exec_sandbox.vm.guest import GuestVm

DISK_MB = 4096
GIB_WRITE = "dd if=/dev/zero of={path} bs=1M count=1024 conv=fsync 2>/dev/null"
GIB_READ = "dd if={path} of=/dev/null bs=1M 2>/dev/null"


def cell(values: list[float]) -> str:
    return f"{percentile(values, 50):.0f} ({percentile(values, 95):.0f})"


def host_ms(command: str) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-c", command], check=True)
    return (time.perf_counter() - started) * 1000


async def throughput(sched: Scheduler, cache: Path) -> None:
    async with await sched.session(language="raw") as session:
        big = "/home/user/big"
        at = time.perf_counter()
        assert (await session.exec(GIB_WRITE.format(path=big), timeout_seconds=600)).exit_code == 0
        write = (time.perf_counter() - at) * 1000
        # The guest's page cache (~150 MB of 192) cannot hold the file: the read is the disk's.
        at = time.perf_counter()
        assert (await session.exec(GIB_READ.format(path=big), timeout_seconds=600)).exit_code == 0
        read = (time.perf_counter() - at) * 1000
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        path = Path(tmp) / "big"
        host_write = host_ms(GIB_WRITE.format(path=path))
        # Dropped from the host's page cache first, as the guest's was too small to keep it.
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        host_read = host_ms(GIB_READ.format(path=path))
    print("| 1 GiB, dd | guest ms | host ms | ratio |")
    print("|---|---|---|---|")
    print(f"| write (fsync) | {write:.0f} | {host_write:.0f} | {write / host_write:.2f}x |")
    print(f"| read | {read:.0f} | {host_read:.0f} | {read / host_read:.2f}x |")


async def start_times(sched: Scheduler, runs: int) -> None:
    provisioner = sched._provisioner  # a VM without a disk exists only here
    memory = sched.config.default_memory_mb
    results: dict[tuple[str, int], list[float]] = {}
    for disk in (0, DISK_MB):  # L1 snapshots of both (a first start schedules the build)
        vm = await provisioner.start_vm("raw", memory, Phases(), disk_mb=disk)
        await vm.aclose()
    assert await provisioner.wait_snapshots(timeout=300)
    for _ in range(runs):
        for disk in (0, DISK_MB):
            phases = Phases()
            at = time.perf_counter()
            vm = await provisioner.start_vm("raw", memory, phases, disk_mb=disk)
            results.setdefault(("L1 restore", disk), []).append((time.perf_counter() - at) * 1000)
            assert phases.l1_hit
            await vm.aclose()
    snapshots = provisioner.snapshots
    provisioner.snapshots = None  # cold boots only from here
    try:
        for _ in range(runs):
            for disk in (0, DISK_MB):
                at = time.perf_counter()
                vm = await provisioner.start_vm("raw", memory, Phases(), disk_mb=disk)
                results.setdefault(("cold boot", disk), []).append(
                    (time.perf_counter() - at) * 1000
                )
                await vm.aclose()
    finally:
        provisioner.snapshots = snapshots
    print("| start | without a disk | with a 4 GiB disk | ratio (p50) |")
    print("|---|---|---|---|")
    for what in ("cold boot", "L1 restore"):
        without, with_disk = results[(what, 0)], results[(what, DISK_MB)]
        ratio = percentile(with_disk, 50) / percentile(without, 50)
        print(f"| {what} | {cell(without)} | {cell(with_disk)} | {ratio:.2f}x |")


async def fork_times(sched: Scheduler, runs: int, cache: Path) -> None:
    provisioner = sched._provisioner
    memory = sched.config.default_memory_mb
    parents: dict[str, GuestVm] = {
        "no disk": await provisioner.start_vm("raw", memory, Phases(), disk_mb=0),
        "fresh disk": await provisioner.start_vm("raw", memory, Phases(), disk_mb=DISK_MB),
    }
    # Written by code in a session (the default disk size), which is then forked like the rest.
    written = await sched.session(language="raw")
    fill = "head -c 268435456 /dev/urandom > /home/user/data && sync"
    assert (await written.exec(fill, timeout_seconds=600)).exit_code == 0
    parents["256 MiB written"] = written.vm
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=cache) as work:
        for _ in range(runs):
            for name, vm in parents.items():
                at = time.perf_counter()
                copies = await fork_vms(vm, 1, Path(work), timeout=120)
                first = name not in results and f"{name}, first" not in results
                key = f"{name}, first" if first and name != "no disk" else name
                results.setdefault(key, []).append((time.perf_counter() - at) * 1000)
                for copy in copies:
                    await copy.aclose()
    await parents["no disk"].aclose()
    await parents["fresh disk"].aclose()
    await written.close()
    base = percentile(results["no disk"], 50)
    print("| fork(1) of a VM with | p50 (p95) ms | ratio to no disk (p50) |")
    print("|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {cell(values)} | {percentile(values, 50) / base:.2f}x |")


async def fork_written(sched: Scheduler, runs: int, cache: Path, written_mb: int) -> None:
    fill = f"head -c {written_mb << 20} /dev/urandom > /home/user/data && sync"
    results: dict[str, list[float]] = {}
    real = workspace.overlays_available
    with tempfile.TemporaryDirectory(dir=cache) as work:
        for _ in range(runs):
            for mode in ("copy on write", "copy"):
                parent = await sched.session(language="raw")
                assert (await parent.exec(fill, timeout_seconds=600)).exit_code == 0
                workspace.overlays_available = real if mode == "copy on write" else lambda: False  # type: ignore[method-assign]
                try:
                    at = time.perf_counter()
                    copies = await fork_vms(parent.vm, 1, Path(work), timeout=120)
                    results.setdefault(mode, []).append((time.perf_counter() - at) * 1000)
                finally:
                    workspace.overlays_available = real  # type: ignore[method-assign]
                for copy in copies:
                    await copy.aclose()
                await parent.close()
    base = percentile(results["copy"], 50)
    print(
        f"| first fork(1) of a VM with {written_mb} MiB written | p50 (p95) ms | "
        f"ratio to the copy (p50) |"
    )
    print("|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {cell(values)} | {percentile(values, 50) / base:.2f}x |")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=["throughput", "start", "fork"])
    parser.add_argument("--debug", action="store_true", help="log each fork's steps")
    parser.add_argument(
        "--written-mb", type=int, default=256, help="data in the last table's parents' disks"
    )
    args = parser.parse_args()
    if args.debug:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("exec_sandbox").setLevel(logging.DEBUG)
    only = set(args.only or ["throughput", "start", "fork"])
    with tempfile.TemporaryDirectory(prefix="sbx-bench-ws-", dir=Path.home() / ".cache") as root:
        cache = Path(root)
        async with Scheduler(config(cache, memory_snapshots=True)) as sched:
            await sched.start()
            if "throughput" in only:
                await throughput(sched, cache)
            if "start" in only:
                await start_times(sched, args.runs)
            if "fork" in only:
                await fork_times(sched, args.runs, cache)
                await fork_written(sched, args.runs, cache, args.written_mb)


if __name__ == "__main__":
    asyncio.run(main())
