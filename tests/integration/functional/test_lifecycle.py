"""Nothing outlives its owner: the Scheduler, a cancelled call, or a SIGKILLed host process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm


async def test_scheduler_exit_kills_a_vm_in_flight(images_ready: None) -> None:
    started = asyncio.Event()
    async with Scheduler() as scheduler:
        task = asyncio.create_task(
            scheduler.run(
                "import time; print('up', flush=True); time.sleep(120)",
                on_stdout=lambda _: started.set(),
            )
        )
        await asyncio.wait_for(started.wait(), 60)
        assert len(qemu_processes(parent=os.getpid())) >= 1  # + maybe a background snapshot build
    await asyncio.sleep(0)
    assert qemu_processes(parent=os.getpid()) == []
    task.cancel()
    with pytest.raises((asyncio.CancelledError, Exception)):
        await task


async def test_cancelled_run_leaves_no_qemu(images_ready: None) -> None:
    started = asyncio.Event()
    async with Scheduler(SchedulerConfig()) as scheduler:
        task = asyncio.create_task(
            scheduler.run(
                "import time; print('up', flush=True); time.sleep(120)",
                on_stdout=lambda _: started.set(),
            )
        )
        await asyncio.wait_for(started.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert qemu_processes(parent=os.getpid()) == []


_HOST_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from exec_sandbox import Scheduler

    async def main():
        async with Scheduler() as s:
            await s.run("import time; print('up', flush=True); time.sleep(120)",
                        on_stdout=lambda text: (print(text, end='', flush=True)))

    asyncio.run(main())
    """
)


def test_sigkill_of_host_process_leaves_no_qemu(images_ready: None) -> None:
    host = subprocess.Popen([sys.executable, "-c", _HOST_SCRIPT], stdout=subprocess.PIPE)
    try:
        assert host.stdout is not None
        assert host.stdout.readline() == b"up\n"
        children = qemu_processes(parent=host.pid)
        assert len(children) >= 1  # the run's VM, maybe a background snapshot build too
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(pid in qemu_processes() for pid in children):
            time.sleep(0.1)
        assert not any(pid in qemu_processes() for pid in children), "QEMU outlived its host"
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
