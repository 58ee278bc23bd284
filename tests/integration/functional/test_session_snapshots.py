"""Live sessions paused to disk, resumed (in another process too) and forked, in real VMs."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exec_sandbox import (
    InputValidationError,
    OutputLimitError,
    Scheduler,
    SessionClosedError,
    SnapshotError,
)
from exec_sandbox.paths import images_dir
from tests.helpers import private_config, qemu_processes

pytestmark = pytest.mark.vm

STATE = r"""
import os, threading, time
numbers = [1, 2, 3]
os.environ["SBX_MARK"] = "kept"
os.makedirs("/home/user/work", exist_ok=True)
os.chdir("/home/user/work")
open("notes.txt", "w").write("saved file")
handle = open("/tmp/handle.txt", "w+")
handle.write("unflushed data")
ticks = [0]
def tick():
    while True:
        ticks[0] += 1
        time.sleep(0.05)
threading.Thread(target=tick, daemon=True).start()
time.sleep(0.3)
"""
CHECK = r"""
import os, time
before = ticks[0]
time.sleep(0.5)
handle.seek(0)
print(numbers, os.environ["SBX_MARK"], os.getcwd(), open("notes.txt").read(), handle.read(),
      ticks[0] > before > 0)
"""
EXPECTED = "[1, 2, 3] kept /home/user/work saved file unflushed data True\n"


async def test_a_paused_session_resumes_in_another_process(
    sched: Scheduler, tmp_path: Path
) -> None:
    session = await sched.session()
    assert (await session.exec(STATE)).exit_code == 0
    snapshot = await session.pause()
    assert session.closed and snapshot.language == "python" and snapshot.exec_count == 1
    with pytest.raises(SessionClosedError, match="paused"):
        await session.exec("print(1)")
    directory = tmp_path / "memory" / "sessions" / snapshot.id
    for path in (directory, directory / "state", directory / "meta.json"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path  # owner only: it is memory
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from exec_sandbox import Scheduler, SchedulerConfig\n"
        "async def main():\n"
        "    config = SchedulerConfig(memory_snapshots=False, memory_snapshot_cache_dir=Path(sys.argv[1]))\n"  # noqa: E501
        "    async with Scheduler(config) as s:\n"
        "        session = await s.resume(sys.argv[2])\n"
        f"        print((await session.exec({CHECK!r})).stdout, end='')\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "memory"), str(snapshot)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.stdout == EXPECTED, proc.stderr[-2000:]


async def test_forks_diverge_and_differ_in_kernel_randomness(sched: Scheduler) -> None:
    async with await sched.session() as parent:
        await parent.exec("import os, random\nitems = ['parent']\nrandom.seed(7)")
        forks = await parent.fork(2)
        assert isinstance(forks, list) and len(forks) == 2
        try:
            for i, fork in enumerate(forks):
                await fork.exec(f"items.append('fork{i}')")
            await parent.exec("items.append('parent-again')")
            out = [
                (await s.exec("print(items, os.urandom(8).hex(), random.random())")).stdout.split()
                for s in (parent, *forks)
            ]
        finally:
            for fork in forks:
                await fork.close()
    assert [o[0] for o in out] == ["['parent',", "['parent',", "['parent',"]
    assert [o[1] for o in out] == ["'parent-again']", "'fork0']", "'fork1']"]
    assert len({o[2] for o in out}) == 3  # the kernel RNG: reseeded in every copy
    assert len({o[3] for o in out}) == 1  # user-space state is copied as it is (documented)


async def test_fork_without_count_gives_one_session(sched: Scheduler) -> None:
    async with await sched.session() as parent:
        await parent.exec("x = 41")
        child = await parent.fork()
        assert not isinstance(child, list)
        async with child:
            assert (await child.exec("print(x + 1)")).stdout == "42\n"
        with pytest.raises(InputValidationError):
            await parent.fork(0)


async def test_a_damaged_or_foreign_snapshot_is_refused(sched: Scheduler, tmp_path: Path) -> None:
    session = await sched.session()
    await session.exec("secret = 1")
    snapshot = await session.pause()
    directory = tmp_path / "memory" / "sessions" / snapshot.id
    state = directory / "state"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x55
    state.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="damaged"):
        await sched.resume(snapshot.id)

    other = await (await sched.session()).pause()
    meta_path = tmp_path / "memory" / "sessions" / other.id / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["machine"]["rootfs"] = "0000000000000000"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SnapshotError, match="rootfs"):
        await sched.resume(other.id)
    with pytest.raises(SnapshotError, match="not a session snapshot id"):
        await sched.resume("../../etc")
    assert await sched.delete_snapshot(other.id) and not await sched.delete_snapshot(other.id)
    assert [s.id for s in await sched.snapshots()] == [snapshot.id]


async def test_a_resumed_session_keeps_its_timeouts_and_limits(sched: Scheduler) -> None:
    session = await sched.session(timeout_seconds=2)
    await session.exec("value = 5")
    snapshot = await session.pause()
    await asyncio.sleep(3)  # the guest's wall clock must catch up with the pause
    resumed = await sched.resume(snapshot)
    async with resumed:
        clock = await resumed.exec("import time; print(time.time())")
        assert abs(float(clock.stdout) - time.time()) < 1.5
        with pytest.raises(OutputLimitError):
            await resumed.exec("print('x' * (2 * 1024 * 1024))")
        assert (await resumed.exec("print(value)")).stdout == "5\n"
        assert (await resumed.exec("import time; time.sleep(30)")).exit_code == -1  # its 2 s
        # The REPL starts afresh after a timeout, within the next exec's time: give it room.
        after = await resumed.exec("print(1)", timeout_seconds=60)
        assert after.stdout == "1\n", (after.exit_code, after.stderr)


async def test_pause_waits_for_a_running_exec(sched: Scheduler) -> None:
    session = await sched.session()
    running = asyncio.create_task(
        session.exec("import time; time.sleep(1); done = 'yes'; print(done)")
    )
    await asyncio.sleep(0.2)
    snapshot = await session.pause()
    assert (await running).stdout == "yes\n"
    async with await sched.resume(snapshot) as resumed:
        assert (await resumed.exec("print(done)")).stdout == "yes\n"


async def test_a_paused_session_frees_its_slot(tmp_path: Path, images_ready: None) -> None:
    async with Scheduler(
        private_config(tmp_path, max_concurrent_vms=1, admission_timeout_seconds=5)
    ) as scheduler:
        first = await scheduler.session()
        await first.exec("name = 'first'")
        snapshot = await first.pause()
        async with await scheduler.session() as second:  # would wait for the slot otherwise
            assert (await second.exec("print(1)")).stdout == "1\n"
        async with await scheduler.resume(snapshot) as again:
            assert (await again.exec("print(name)")).stdout == "first\n"
    assert qemu_processes(parent=os.getpid()) == []


async def test_an_idle_session_can_be_paused_instead_of_closed(
    tmp_path: Path, images_ready: None
) -> None:
    config = private_config(tmp_path, session_idle_timeout_seconds=10, session_idle_action="pause")
    async with Scheduler(config) as scheduler:
        session = await scheduler.session()
        await session.exec("kept = 'after idling'")
        for _ in range(600):  # the idle timer, then the pause
            if session.closed:
                break
            await asyncio.sleep(0.1)
        assert session.paused_as is not None
        assert [s.id for s in await scheduler.snapshots()] == [session.paused_as.id]
        async with await scheduler.resume(session.paused_as) as resumed:
            assert (await resumed.exec("print(kept)")).stdout == "after idling\n"
    assert qemu_processes(parent=os.getpid()) == []


async def test_sbx_session_lists_and_deletes_paused_sessions(
    tmp_path: Path, images_ready: None
) -> None:
    async with Scheduler(
        private_config(tmp_path, memory_snapshot_cache_dir=tmp_path / "memory-snapshots")
    ) as s:
        snapshot = await (await s.session()).pause()
    env = {**os.environ, "EXEC_SANDBOX_CACHE_DIR": str(tmp_path)}
    sbx = [sys.executable, "-m", "exec_sandbox.cli.main", "session"]
    listed = subprocess.run(
        [*sbx, "list", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert [entry["id"] for entry in json.loads(listed.stdout)] == [snapshot.id]
    deleted = subprocess.run(
        [*sbx, "delete", snapshot.id], capture_output=True, text=True, env=env, timeout=60
    )
    assert deleted.returncode == 0
    again = subprocess.run(
        [*sbx, "delete", snapshot.id], capture_output=True, text=True, env=env, timeout=60
    )
    assert again.returncode == 1 and "no paused session" in again.stdout


def test_sbx_session_new_and_resume_carry_state_between_commands(
    tmp_path: Path, images_ready: None
) -> None:
    env = {
        **os.environ,
        "EXEC_SANDBOX_CACHE_DIR": str(tmp_path),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
    }

    def sbx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "exec_sandbox.cli.main", "session", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )

    created = sbx(
        "new", "--json", "-e", "WHO=cli", "-c", "import os; x = 41; print(os.environ['WHO'])"
    )
    assert created.returncode == 0, created.stderr
    report = json.loads(created.stdout)
    assert report["result"]["stdout"] == "cli\n"
    first = report["snapshot"]["id"]
    resumed = sbx("resume", first, "-c", "x += 1; print(x)")
    assert (resumed.returncode, resumed.stdout) == (0, "42\n"), resumed.stderr
    second = resumed.stderr.strip().rsplit(" ", 1)[-1]
    assert resumed.stderr.startswith("sbx: paused as ") and second != first
    # A failing cell: its status is the command's, and the state before it is kept.
    failed = sbx("resume", second, "--keep", "-c", "x += 1; raise SystemExit(3)")
    assert failed.returncode == 3
    third = failed.stderr.strip().rsplit(" ", 1)[-1]
    listed = {entry["id"] for entry in json.loads(sbx("list", "--json").stdout)}
    assert listed == {second, third}  # resume replaced the first; --keep kept the second
    assert sbx("resume", third, "-c", "print(x)").stdout == "43\n"
    missing = sbx("resume", first, "-c", "print(x)")
    assert missing.returncode == 125 and "no session snapshot" in missing.stderr
    assert sbx("resume", "not-an-id", "-c", "1").returncode == 2


async def test_a_failed_pause_leaves_the_session_running(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    import exec_sandbox.vm.migration as vm_module

    session = await sched.session()
    await session.exec("data = list(range(1000))")
    # A stream limit far below what a 192 MB guest writes: the save fails part way.
    monkeypatch.setattr(vm_module, "_STATE_MAX_BYTES", -(190 << 20))
    with pytest.raises(SnapshotError, match="saving the VM's state failed"):
        await session.pause()
    monkeypatch.undo()
    assert not session.closed
    assert (await session.exec("print(sum(data))")).stdout == "499500\n"
    assert await sched.snapshots() == []
    await session.close()


def _smaps(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


async def test_forks_share_their_unchanged_memory(sched: Scheduler) -> None:
    async with await sched.session() as parent:
        await parent.exec("blob = bytes(range(256)) * (120 * 1024)")  # 30 MB of data
        forks = await parent.fork(2)
        assert isinstance(forks, list)
        try:
            for fork in forks:
                assert (await fork.exec("print(len(blob))")).stdout == f"{256 * 120 * 1024}\n"
            pids = [fork.vm.pid for fork in forks]
            pss = sum(_smaps(pid, "Pss") for pid in pids)
            rss = sum(_smaps(pid, "Rss") for pid in pids)
            # Pages both copies map from their template are counted half for each in PSS.
            assert pss < 0.8 * rss, (pss, rss)
        finally:
            for fork in forks:
                await fork.close()


@pytest.mark.parametrize("count", [1, 2])
async def test_a_failed_fork_stream_leaves_the_parent_running_and_no_copy(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    from dataclasses import replace

    from exec_sandbox.vm.guest import GuestVm

    spawn = GuestVm.spawn.__func__  # type: ignore[attr-defined]

    async def smaller_receiver(cls: type[GuestVm], spec: Any, **kwargs: Any) -> GuestVm:
        # A receiving QEMU with less RAM than the parent: it refuses the stream part way
        # (QEMU's RAM block length check), as a receiver that dies mid-stream would.
        if kwargs.get("incoming"):
            spec = replace(spec, memory_mb=spec.memory_mb // 2)
        return await spawn(cls, spec, **kwargs)

    async with await sched.session() as parent:
        await parent.exec("data = list(range(1000))")
        monkeypatch.setattr(GuestVm, "spawn", classmethod(smaller_receiver))
        with pytest.raises(SnapshotError, match="streaming the VM's state failed"):
            await parent.fork(count)
        monkeypatch.undo()
        assert not parent.closed
        assert (await parent.exec("print(sum(data))")).stdout == "499500\n"
        assert qemu_processes(parent=os.getpid()) == [parent.vm.pid]  # no copy, no receiver


@pytest.mark.parametrize("point", ["receiver starting", "stream under way"])
async def test_a_cancelled_fork_leaves_the_parent_running_and_no_copy(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    import exec_sandbox.vm.migration as migration_module
    from exec_sandbox.vm.guest import GuestVm

    reached = asyncio.Event()
    spawn = GuestVm.spawn.__func__  # type: ignore[attr-defined]
    wait_migration = migration_module._wait_migration

    async def spawning(cls: type[GuestVm], spec: Any, **kwargs: Any) -> GuestVm:
        reached.set()
        return await spawn(cls, spec, **kwargs)

    async def streaming(qmp: Any, **kwargs: Any) -> None:
        reached.set()
        await wait_migration(qmp, **kwargs)

    if point == "receiver starting":
        monkeypatch.setattr(GuestVm, "spawn", classmethod(spawning))
    else:
        monkeypatch.setattr(migration_module, "_wait_migration", streaming)
    async with await sched.session() as parent:
        await parent.exec("data = list(range(1000))")
        fork = asyncio.ensure_future(parent.fork())
        await reached.wait()  # the fork is inside that step now
        fork.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fork
        monkeypatch.undo()
        assert not parent.closed
        assert (await parent.exec("print(sum(data))")).stdout == "499500\n"
        assert qemu_processes(parent=os.getpid()) == [parent.vm.pid]
        child = await parent.fork()  # the parent's monitor is still in step
        async with child:
            assert (await child.exec("print(len(data))")).stdout == "1000\n"
