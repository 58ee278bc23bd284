"""A scheduler's VMs from spawn to close (`VmRegistry`), so that its close() can end them all."""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..errors import SandboxError


class Closable(Protocol):
    """A registered VM (a GuestVm): close() kills it."""

    def close(self) -> None: ...


class Killable(Protocol):
    """A QEMU between its fork and its GuestVm (the C core's Vm): kill() SIGKILLs it."""

    def kill(self) -> None: ...


class VmRegistry:
    """Every VM of one owner (a Scheduler) from the moment its QEMU is spawned until it is
    closed, booting ones included: closing the registry kills them all and refuses new spawns,
    so nothing of the owner runs after its close(). Handed to whatever starts a VM
    (`GuestVm.spawn`, `process.spawn`), never carried in a VmSpec: a spec says how a VM starts,
    the registry who owns it."""

    def __init__(self) -> None:
        self._vms: set[Closable] = set()
        # QEMUs forked whose exec is not confirmed yet (no GuestVm so far): close() kills them
        # too, and wait_started() waits until their spawns have released them.
        self._starting: set[Killable] = set()
        self._started = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._vms)

    def check_open(self) -> None:
        if self.closed:
            raise SandboxError("the scheduler is closed")

    def add(self, vm: Closable) -> None:
        self._vms.add(vm)

    def discard(self, vm: Closable) -> None:
        self._vms.discard(vm)

    def starting(self, vm: Killable) -> None:
        self._starting.add(vm)

    def started(self, vm: Killable) -> None:
        self._starting.discard(vm)
        if not self._starting:
            self._started.set()

    def close(self) -> None:
        """Refuse new VMs and kill every registered one, starting ones included (their release
        follows: wait_started(), then wait_released()). Idempotent."""
        self.closed = True
        for vm in self._starting:
            vm.kill()
        while self._vms:
            self._vms.pop().close()

    async def wait_started(self) -> None:
        """Until no spawn is between its fork and its GuestVm (after close(): each of them has
        handed its QEMU to a release, which wait_released() then waits for)."""
        while self._starting:
            self._started.clear()
            await self._started.wait()
