"""A scheduler's VMs from spawn to close (`VmRegistry`), so that its close() can end them all."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..errors import SandboxError

if TYPE_CHECKING:
    from .guest import GuestVm


class VmRegistry:
    """Every GuestVm of one owner (a Scheduler) from the moment its QEMU is spawned until it is
    closed, booting ones included: closing the registry kills them all and refuses new spawns,
    so nothing of the owner runs after its close() (issue 12, item 12)."""

    def __init__(self) -> None:
        self._vms: set[GuestVm] = set()
        # QEMUs forked whose exec is not confirmed yet (no GuestVm so far): close() kills them
        # too, and wait_started() waits until their spawns have released them.
        self._starting: set[Any] = set()
        self._started = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._vms)

    def check_open(self) -> None:
        if self.closed:
            raise SandboxError("the scheduler is closed")

    def add(self, vm: GuestVm) -> None:
        self._vms.add(vm)

    def discard(self, vm: GuestVm) -> None:
        self._vms.discard(vm)

    def starting(self, vm: Any) -> None:
        self._starting.add(vm)

    def started(self, vm: Any) -> None:
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
