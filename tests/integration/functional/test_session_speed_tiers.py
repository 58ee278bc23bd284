"""Sessions and the speed tiers: a session takes its VM like run() (pool, L1 clone, cold boot)
and holds its admission ticket until it is closed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig, VmCapacityError
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm


async def test_session_holds_its_admission_ticket_until_closed(
    images_ready: None, tmp_path: Path
) -> None:
    config = SchedulerConfig(
        memory_snapshots=False,
        max_concurrent_vms=1,
        admission_timeout_seconds=1.0,
    )
    async with Scheduler(config) as sched:
        session = await sched.session(language="raw")
        assert (await session.exec("echo in-session")).stdout == "in-session\n"
        with pytest.raises(VmCapacityError):
            await sched.run("echo no-room", language="raw")
        await session.close()
        assert (await sched.run("echo room", language="raw")).stdout == "room\n"
    assert qemu_processes(parent=os.getpid()) == []


async def test_sessions_from_one_snapshot_start_their_repl_after_the_reseed(
    images_ready: None, tmp_path: Path
) -> None:
    # Python's random module seeds itself from the kernel when the REPL starts: two clones of a
    # template in which the REPL already ran would print the same numbers.
    config = SchedulerConfig(memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=2)
    async with Scheduler(config) as sched:
        assert await sched.prepare_snapshot("python")
        draws = []
        for _ in range(2):
            async with await sched.session(language="python") as session:
                assert session.l1_cache_hit and not session.warm_pool_hit
                await session.exec("import random")
                result = await session.exec("print(random.getrandbits(128))")
                draws.append(result.stdout.strip())
                # The state persists in the clone's REPL like in a booted one.
                assert (await session.exec("print(random.__name__)")).stdout == "random\n"
    assert draws[0] != draws[1], draws
    assert qemu_processes(parent=os.getpid()) == []


async def test_session_takes_a_pooled_vm(images_ready: None, tmp_path: Path) -> None:
    config = SchedulerConfig(memory_snapshots=False, warm_pool_size=1, max_concurrent_vms=4)
    async with Scheduler(config) as sched:
        await sched.wait_pool_ready(timeout=300)
        async with await sched.session(language="raw") as session:
            assert session.warm_pool_hit
            await session.exec("x=41")
            assert (await session.exec("echo $((x+1))")).stdout == "42\n"
    assert qemu_processes(parent=os.getpid()) == []
