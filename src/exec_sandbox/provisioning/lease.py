"""A `Lease`: one VM and the admission ticket it holds, owned and released together.

Every VM a scheduler hands out (to a run(), a session, the warm pool, a fork) holds an admission
ticket for its lifetime; whoever holds the lease owns both, and ending the lease ends both, once,
whichever path gets there first (the result is out, the call failed or was cancelled, the session
closed, the pool reclaimed it, the scheduler closed). `Lease.acquire()` makes a lease when the VM
is started for a ticket taken first: if the VM cannot be had, the ticket goes back before the
error reaches the caller. A fork, whose copies exist before they are owned, makes its leases
directly and gives its tickets back itself if the copies fail (snapshots/service.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableSet
from typing import Generic, Protocol, TypeVar

from .admission import Ticket


class LeasedVm(Protocol):
    """What a lease needs of its VM (a GuestVm; unit tests' stand-ins)."""

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


VmT = TypeVar("VmT", bound=LeasedVm)


class Lease(Generic[VmT]):
    def __init__(
        self, vm: VmT, ticket: Ticket, holder: MutableSet[Lease[VmT]] | None = None
    ) -> None:
        """holder: the owner's set of live leases (Scheduler.close() ends those left); the
        lease is in it until it ends."""
        self.vm = vm
        self.ticket = ticket
        self._holder = holder
        self.ended = False
        if holder is not None:
            holder.add(self)

    @classmethod
    async def acquire(
        cls,
        ticket: Ticket,
        start: Callable[[], Awaitable[VmT]],
        holder: MutableSet[Lease[VmT]] | None = None,
    ) -> Lease[VmT]:
        """The lease of the VM start() gives, under ticket. If start() fails or is cancelled,
        the ticket is released before the error propagates."""
        try:
            vm = await start()
        except BaseException:
            ticket.release()
            raise
        return cls(vm, ticket, holder)

    def move_to(self, holder: MutableSet[Lease[VmT]]) -> None:
        """Hand the lease to another owner's set (a pooled VM taken by a request)."""
        if self._holder is not None:
            self._holder.discard(self)
        self._holder = holder
        if not self.ended:
            holder.add(self)

    def discard(self) -> None:
        """Kill the VM now and give its ticket back (its reap follows off the loop, and
        Scheduler.close() waits for it). Idempotent."""
        if self.ended:
            return
        self.ended = True
        if self._holder is not None:
            self._holder.discard(self)
        try:
            self.vm.close()
        finally:
            self.ticket.release()

    async def release(self) -> None:
        """discard(), then wait until the VM's QEMU is reaped: the caller may then count on
        nothing of it running. Idempotent."""
        self.discard()
        await self.vm.aclose()
