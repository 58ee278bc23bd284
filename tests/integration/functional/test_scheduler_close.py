"""Scheduler.close() ends everything the scheduler started: once it returns no
QEMU process of the scheduler is left, and a run() or session() still booting its VM ends with a
SandboxError instead of handing out a VM that outlived the scheduler."""

from __future__ import annotations

import asyncio
import os

import pytest

from exec_sandbox import SandboxError, Scheduler, SchedulerConfig
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm


async def _until_qemu_runs() -> None:
    async def poll() -> None:
        while not qemu_processes(parent=os.getpid()):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), 60)  # hang guard


@pytest.mark.parametrize("call", ["session", "run"])
async def test_close_during_boot_kills_the_vm_and_fails_the_call(
    images_ready: None, call: str
) -> None:
    scheduler = Scheduler(
        SchedulerConfig(max_concurrent_vms=2, warm_pool_size=0, memory_snapshots=False)
    )
    await scheduler.start()
    try:
        if call == "session":
            pending = asyncio.ensure_future(scheduler.session(language="python"))
        else:
            pending = asyncio.ensure_future(scheduler.run("print(1)", language="python"))
        await _until_qemu_runs()  # the VM is booting
    finally:
        await scheduler.close()
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived Scheduler.close()"
    with pytest.raises(SandboxError):
        result = await asyncio.wait_for(pending, 60)
        if call == "session":
            await result.exec("print('alive after scheduler close')")


async def test_close_ends_a_running_exec_and_leaves_no_qemu(images_ready: None) -> None:
    scheduler = Scheduler(SchedulerConfig(max_concurrent_vms=2, warm_pool_size=0))
    await scheduler.start()
    try:
        session = await scheduler.session(language="python")
        pending = asyncio.ensure_future(session.exec("import time; time.sleep(60)"))
        await asyncio.sleep(0.5)
    finally:
        await scheduler.close()
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived Scheduler.close()"
    with pytest.raises(SandboxError):
        await asyncio.wait_for(pending, 30)
    assert session.closed
