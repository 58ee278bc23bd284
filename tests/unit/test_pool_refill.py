"""The warm pool inside a Scheduler, its VMs coming from provisioning (start, warm-up, PRESTART),
with GUEST STAND-INS for VMs (tests/unit/guest_stand_in.py: processes speaking the agent's frames
in QEMU's place, no VM). tests/unit/test_warm_pool.py covers the pool's own bookkeeping with
objects for VMs; the speed of a real pool hit is for tests/integration and bench/."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from exec_sandbox import VmTransientError
from exec_sandbox.provisioning import pool as pool_module
from tests.unit.guest_stand_in import StandInVms, stand_in_scheduler

HANG_GUARD_SECONDS = 30.0


async def test_a_pool_hit_serves_the_request_and_the_pool_refills(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path, warm_pool_size={"python": 1}) as (scheduler, vms):
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert vms.started == ["boot"]
        result = await scheduler.run("out pooled")
        assert result.stdout == "pooled\n" and result.warm_pool_hit
        assert vms.started == ["boot"]  # served by the pooled VM: nothing started for it
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert vms.started == ["boot", "boot"]  # the refill replaced it
        assert scheduler.capacity().warm_pool == {"python": 1, "javascript": 0, "raw": 0}


async def test_a_pooled_vm_that_died_idle_is_discarded_and_the_request_boots(
    tmp_path: Path,
) -> None:
    async with stand_in_scheduler(tmp_path, warm_pool_size={"python": 1}) as (scheduler, vms):
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        pooled = vms.vms[0]
        os.kill(pooled.pid, signal.SIGKILL)
        while pooled.alive:  # until the loop has seen its exit
            await asyncio.sleep(0.01)
        result = await scheduler.run("out fresh")
        assert result.stdout == "fresh\n" and not result.warm_pool_hit
        # The request had to boot its own VM; the dead pooled one gave its ticket back.
        assert vms.started[:2] == ["boot", "boot"]
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert scheduler.capacity().vms_in_use == 1  # only the refilled pooled VM


async def test_a_pool_whose_vms_keep_failing_makes_wait_pool_ready_raise(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "_RETRY_FIRST_SECONDS", 0.01)
    vms = StandInVms(tmp_path / "stand-in", boot_modes=["exit"] * 10)
    async with stand_in_scheduler(tmp_path, vms, warm_pool_size={"python": 1}) as (scheduler, _):
        with pytest.raises(VmTransientError, match="failed 3 times in a row"):
            await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert scheduler.capacity().vms_in_use == 0  # no failed start kept its ticket
