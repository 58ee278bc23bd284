"""A stalled guest cannot hang a session's file transfer: with the VM's QEMU
stopped (SIGSTOP), write_file, read_file and list_files end with GuestAgentError once nothing has
moved for the stall limit, the session is closed, and later calls fail at once instead of
queueing behind the stuck one. The limit is shortened for the test (120 s in production)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from exec_sandbox import Scheduler, SessionClosedError
from exec_sandbox.errors import GuestAgentError
from exec_sandbox.vm import file_transfer

pytestmark = pytest.mark.vm

STALL = 4.0


@pytest.fixture
def short_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_transfer, "_STALL_SECONDS", STALL)


async def test_write_to_a_stopped_vm_ends_and_closes_the_session(
    scheduler: Scheduler, short_stall: None
) -> None:
    session = await scheduler.session(language="python")
    try:
        os.kill(session._vm.pid, signal.SIGSTOP)
        # 64 MiB cannot fit in the socket buffers: the host waits for the queue to drain.
        with pytest.raises(GuestAgentError, match="no progress"):
            await asyncio.wait_for(session.write_file("big.bin", bytes(64 << 20)), 60)
        assert session.closed
        # The stuck call released the session: the next one fails at once, it does not queue.
        with pytest.raises(SessionClosedError):
            await asyncio.wait_for(session.list_files(), 5)
    finally:
        await session.close()


@pytest.mark.parametrize("call", ["read_file", "list_files"])
async def test_read_and_list_from_a_stopped_vm_end_within_the_stall_limit(
    scheduler: Scheduler, short_stall: None, call: str
) -> None:
    session = await scheduler.session(language="python")
    try:
        await session.write_file("small.bin", b"x" * 1000)
        os.kill(session._vm.pid, signal.SIGSTOP)
        operation = session.read_file("small.bin") if call == "read_file" else session.list_files()
        # Found one stall period after the last progress (plus one check interval), not two.
        with pytest.raises(GuestAgentError, match="no progress"):
            await asyncio.wait_for(operation, STALL * 1.75)
        assert session.closed
    finally:
        await session.close()
