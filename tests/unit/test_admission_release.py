"""Every failure path gives its admission ticket back and leaves no process behind, through a
Scheduler whose VMs are GUEST STAND-INS (tests/unit/guest_stand_in.py: processes speaking the
agent's frames in QEMU's place, no VM; an EXEC's code is a script of what the stand-in answers).
`capacity().vms_in_use` is admission's own count; the stand-in factory checks at the end that
no stand-in process outlived the scheduler."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from exec_sandbox import (
    CommunicationOutcomeUnknownError,
    OutputLimitError,
    Scheduler,
    SnapshotError,
    VmTransientError,
)
from exec_sandbox.snapshots.identity import machine_identity
from exec_sandbox.snapshots.sessions import SESSION_SNAPSHOT_FORMAT
from exec_sandbox.vm.qmp import QmpError
from tests.unit.guest_stand_in import StandInVms, stand_in_scheduler


async def _settled(scheduler: Scheduler) -> int:
    """VMs admission counts once the loop has run the retirements due (a run's VM is
    destroyed on the loop's next turn after its result)."""
    await asyncio.sleep(0)
    return scheduler.capacity().vms_in_use


async def test_a_finished_run_gives_its_ticket_back(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        assert (await scheduler.run("out done")).stdout == "done\n"
        assert await _settled(scheduler) == 0


async def test_a_run_whose_vm_does_not_start_gives_its_ticket_back(tmp_path: Path) -> None:
    vms = StandInVms(tmp_path / "stand-in", boot_modes=["exit", "exit"])
    async with stand_in_scheduler(tmp_path, vms) as (scheduler, _):
        for _ in range(2):
            with pytest.raises(VmTransientError):
                await scheduler.run("out never")
            assert await _settled(scheduler) == 0


async def test_a_run_whose_guest_dies_gives_its_ticket_back(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, vms):
        with pytest.raises(CommunicationOutcomeUnknownError):
            await scheduler.run("out before\ndie")
        assert await _settled(scheduler) == 0
        assert vms.live_processes() == []  # run() returned once its "QEMU" was reaped


async def test_a_cancelled_run_gives_its_ticket_back_and_ends_its_vm(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, vms):
        task = asyncio.ensure_future(scheduler.run("hang"))
        while not vms.vms:  # until its stand-in is up and the code dispatched
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _settled(scheduler) == 0
        assert vms.live_processes() == []


async def test_output_over_the_limit_gives_the_ticket_back_and_keeps_the_output(
    tmp_path: Path,
) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        with pytest.raises(OutputLimitError) as raised:
            await scheduler.run("out partial\nstdout-limit")
        assert raised.value.stdout == "partial\n"
        assert await _settled(scheduler) == 0


async def test_sessions_hold_their_ticket_until_closed(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        session = await scheduler.session()
        assert scheduler.capacity().vms_in_use == 1
        await session.close()
        await session.close()  # idempotent: the ticket goes back once
        assert scheduler.capacity().vms_in_use == 0


async def test_a_failed_fork_gives_back_every_ticket_it_took(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path, max_concurrent_vms=3) as (scheduler, _):
        session = await scheduler.session()
        # A stand-in has no QMP: saving the parent's state fails before any copy starts.
        with pytest.raises((SnapshotError, QmpError)):
            await session.fork(2)
        assert scheduler.capacity().vms_in_use == 1  # the parent's own
        assert not session.closed
        assert (await session.exec("out still here")).stdout == "still here\n"
        await session.close()
        assert scheduler.capacity().vms_in_use == 0


async def test_close_ends_runs_in_flight_and_returns_every_ticket(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, vms):
        task = asyncio.ensure_future(scheduler.run("hang"))
        session = await scheduler.session()
        while len(vms.vms) < 2:
            await asyncio.sleep(0.01)
        await scheduler.close()
        with pytest.raises(Exception) as raised:
            await task
        assert isinstance(raised.value, (CommunicationOutcomeUnknownError, VmTransientError))
        assert session.closed
        assert scheduler.capacity().vms_in_use == 0
        assert vms.live_processes() == []


async def test_a_resume_whose_snapshot_is_damaged_gives_its_ticket_back(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        spec = scheduler._provisioner.spec(scheduler.config.default_memory_mb)
        snapshot_id = "ab" * 16
        directory = scheduler.config.memory_snapshot_cache_dir / "sessions" / snapshot_id
        directory.mkdir(parents=True)
        state = b"GUEST STAND-IN: not a migration stream\n"
        (directory / "state").write_bytes(state)
        meta = {
            "format": SESSION_SNAPSHOT_FORMAT,
            "id": snapshot_id,
            "language": "python",
            "created": 0.0,
            "size": len(state),
            "sha256": "0" * 64,
            "machine": machine_identity(spec),
            "layer": None,
            "packages": [],
            "session": {"timeout": 30, "env": {}, "exec_count": 0},
        }
        (directory / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(SnapshotError, match="damaged"):
            await scheduler.resume(snapshot_id)
        assert scheduler.capacity().vms_in_use == 0
