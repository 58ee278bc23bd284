"""The session state machine (session.py: open, busy, closed, and pausing when idle) through a
Scheduler whose VMs are GUEST STAND-INS (tests/unit/guest_stand_in.py: processes speaking the
agent's frames in QEMU's place, no VM; an EXEC's code is a script of what the stand-in answers,
so nothing here shows a REPL keeping state: tests/integration/functional/test_session.py does).
The idle timer's expiry is triggered directly (`_on_idle`) instead of waiting its minimum 10 s."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from exec_sandbox import (
    CommunicationOutcomeUnknownError,
    OutputLimitError,
    SessionClosedError,
    SnapshotError,
)
from exec_sandbox.vm.qmp import QmpError
from tests.unit.guest_stand_in import stand_in_scheduler


async def test_a_closed_session_refuses_every_call(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        session = await scheduler.session()
        assert session.close_reason == ""
        await session.close()
        assert session.closed and session.close_reason == "closed by the caller"
        with pytest.raises(SessionClosedError, match="closed by the caller"):
            await session.exec("out late")
        with pytest.raises(SessionClosedError):
            await session.list_files()
        with pytest.raises(SessionClosedError):
            await session.pause()


async def test_calls_on_a_busy_session_run_one_at_a_time_in_call_order(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        async with await scheduler.session() as session:
            first = asyncio.ensure_future(session.exec("sleep 0.2\nout first"))
            second = asyncio.ensure_future(session.exec("out second"))
            done, _pending = await asyncio.wait(
                {first, second}, return_when=asyncio.FIRST_COMPLETED
            )
            assert done == {first}  # the later call waited for the earlier one
            assert (await first).stdout == "first\n" and (await second).stdout == "second\n"


async def test_a_busy_session_is_not_closed_by_its_idle_timer(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        async with await scheduler.session() as session:
            running = asyncio.ensure_future(session.exec("sleep 0.2\nout done"))
            await asyncio.sleep(0.05)
            session._on_idle()  # the timer expires while the exec runs
            assert not session.closed
            assert (await running).stdout == "done\n"
            session._on_idle()  # now it is idle
            assert session.closed
            with pytest.raises(SessionClosedError, match="idle for"):
                await session.exec("out late")
            assert scheduler.capacity().vms_in_use == 0


async def test_an_idle_session_that_cannot_be_paused_is_closed(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path, session_idle_action="pause") as (scheduler, _):
        session = await scheduler.session()
        session._on_idle()
        assert session._idle_pause is not None
        await session._idle_pause  # a stand-in has no QMP: the pause fails
        assert session.closed and session.paused_as is None
        with pytest.raises(SessionClosedError, match="pausing failed"):
            await session.exec("out late")
        assert scheduler.capacity().vms_in_use == 0


async def test_a_failed_pause_leaves_the_session_open(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        async with await scheduler.session() as session:
            with pytest.raises((SnapshotError, QmpError)):
                await session.pause()
            assert not session.closed
            assert (await session.exec("out on")).stdout == "on\n"


async def test_a_guest_that_dies_closes_the_session(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        session = await scheduler.session()
        with pytest.raises(CommunicationOutcomeUnknownError):
            await session.exec("die")
        assert session.closed
        with pytest.raises(SessionClosedError, match="the VM"):
            await session.exec("out late")
        assert scheduler.capacity().vms_in_use == 0


async def test_exit_137_closes_the_session_and_says_why(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        session = await scheduler.session()
        result = await session.exec("exit 137")
        assert result.exit_code == 137 and "The session is closed" in result.stderr
        assert session.closed and "SIGKILL" in session.close_reason
        with pytest.raises(SessionClosedError, match="SIGKILL"):
            await session.exec("out late")
        assert scheduler.capacity().vms_in_use == 0


async def test_a_timeout_or_output_limit_keeps_the_session_open(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        async with await scheduler.session() as session:
            timed_out = await session.exec("timeout")
            assert timed_out.timed_out and "the REPL was reset" in timed_out.stderr
            with pytest.raises(OutputLimitError) as raised:
                await session.exec("out partial\nstdout-limit")
            assert raised.value.stdout == "partial\n"
            assert not session.closed
            assert (await session.exec("out alive")).stdout == "alive\n"
