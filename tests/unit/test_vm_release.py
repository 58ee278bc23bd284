"""Closing a VM never blocks the loop: QEMU is SIGKILLed at once, and its reap, fds and cgroup are
released after its pidfd is readable, in an executor thread, tracked until done (`process.release`,
`wait_released`). With a real child (/bin/sleep standing in for QEMU) and with a stand-in that
has no pidfd (Linux < 5.3), whose blocking reap must then happen in the thread too."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from exec_sandbox import _execsbx
from exec_sandbox.vm import process


async def test_release_kills_at_once_and_reaps_off_the_loop(tmp_path: Path) -> None:
    # A stand-in that ignores QEMU's arguments and waits (/bin/sleep given them exits with 1 at
    # once, sometimes before the kill).
    qemu = tmp_path / "waits"
    qemu.write_text("#!/bin/sh\nexec sleep 60\n")
    qemu.chmod(0o755)
    vm = _execsbx.Vm(qemu_binary=str(qemu), kernel="k", rootfs="r", memory_mb=128)
    await process.wait_started(asyncio.get_running_loop(), vm)  # sleep's exec worked
    pid = vm.pid
    task = process.release(asyncio.get_running_loop(), vm)
    assert not vm.closed  # nothing blocking happened on the loop yet
    await process.wait_released()
    assert task.done() and vm.closed
    assert vm.poll_exit() == -9  # SIGKILLed, then reaped
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError("the child outlived its release")


class _NoPidfdVm:
    """A stand-in for _execsbx.Vm on a kernel without pidfds."""

    pid = 12345
    pidfd = -1

    def __init__(self) -> None:
        self.killed = False
        self.closed_on: threading.Thread | None = None

    def kill(self) -> None:
        self.killed = True

    def poll_exit(self) -> int | None:
        raise AssertionError("without a pidfd the loop must not wait for the exit")

    def close(self) -> None:
        self.closed_on = threading.current_thread()


async def test_release_without_a_pidfd_reaps_in_a_thread() -> None:
    vm = _NoPidfdVm()
    process.release(asyncio.get_running_loop(), vm)
    assert vm.killed
    await process.wait_released()
    assert vm.closed_on is not None and vm.closed_on is not threading.main_thread()
