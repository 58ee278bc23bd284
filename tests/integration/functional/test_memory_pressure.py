"""Code that allocates until it runs out fails inside its VM (MemoryError, or the guest kernel's
OOM killer: exit 137, said in stderr), on a cold-booted VM and on an L1 snapshot clone alike; the
host never kills QEMU for it, and a clone's memory use does not grow what the scheduler holds
(the sealed copy of the template's RAM that every clone maps)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from tests.helpers import open_fds, qemu_processes

pytestmark = pytest.mark.vm

MEMORY_MB = 512
# Touches every byte it allocates (b"\x01" * n writes them), 16 MiB at a time.
MEMORY_BOMB = """
chunks = []
try:
    while True:
        chunks.append(b"\\x01" * (16 << 20))
except MemoryError:
    print("MemoryError after", len(chunks) * 16, "MiB")
"""


@pytest.fixture(params=["cold boot", "L1 clone"])
async def scheduler_on_path(
    request: pytest.FixtureRequest, images_ready: None, tmp_path: Path
) -> AsyncIterator[tuple[Scheduler, bool]]:
    l1 = request.param == "L1 clone"
    fds_before = open_fds()
    config = SchedulerConfig(
        max_concurrent_vms=2, memory_snapshots=l1, memory_snapshot_cache_dir=tmp_path / "snapshots"
    )
    async with Scheduler(config) as sched:
        if l1:
            assert await sched.prepare_snapshot("python", memory_mb=MEMORY_MB)
        yield sched, l1
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"
    leaked = {fd for fd in open_fds() - fds_before if not fd.startswith("anon_inode:[event")}
    assert not leaked, f"fds outlived the Scheduler: {leaked}"


def _snapshot_ram_held_mib() -> int:
    """MiB allocated in this process's sealed snapshot RAM copies (memfds)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "sbx-snapshot-ram" in os.readlink(f"/proc/self/fd/{fd}"):
                total += os.stat(f"/proc/self/fd/{fd}").st_blocks * 512
        except OSError:
            continue
    return total >> 20


def _failed_inside(stdout: str, stderr: str, exit_code: int) -> None:
    if "MemoryError" in stdout:
        return
    assert exit_code == 137, (exit_code, stdout, stderr)
    assert "out of memory" in stderr, stderr


async def test_memory_bomb_fails_inside_the_vm(scheduler_on_path: tuple[Scheduler, bool]) -> None:
    scheduler, l1 = scheduler_on_path
    result = await scheduler.run("print('warm')", memory_mb=MEMORY_MB)
    assert result.l1_cache_hit == l1
    held_before = _snapshot_ram_held_mib()

    result = await scheduler.run(MEMORY_BOMB, memory_mb=MEMORY_MB, timeout_seconds=120)

    assert result.l1_cache_hit == l1
    _failed_inside(result.stdout, result.stderr, result.exit_code)
    # The VM after it is as good as new, and the clone's pages did not land in the copy of the
    # template's RAM that this scheduler holds for every clone.
    assert (await scheduler.run("print(6 * 7)", memory_mb=MEMORY_MB)).stdout == "42\n"
    assert _snapshot_ram_held_mib() == held_before


async def test_memory_bomb_in_a_session_says_what_happened(
    scheduler_on_path: tuple[Scheduler, bool],
) -> None:
    scheduler, l1 = scheduler_on_path
    async with await scheduler.session(memory_mb=MEMORY_MB) as session:
        assert session.l1_cache_hit == l1
        result = await session.exec(MEMORY_BOMB, timeout_seconds=120)
        _failed_inside(result.stdout, result.stderr, result.exit_code)
