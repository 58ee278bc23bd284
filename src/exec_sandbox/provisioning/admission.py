"""Admission control: how many VMs (and how much guest RAM and how many vCPUs) run at once.

Every VM, whether it serves a request, waits in the warm pool or builds a snapshot template,
holds a `Ticket` for its lifetime. Three budgets must all hold for a ticket to be granted:
- a VM count (`SchedulerConfig.max_concurrent_vms`),
- guest RAM: host RAM x memory_overcommit_ratio (guests rarely touch all the RAM they are given,
  and snapshot clones share their template's pages),
- vCPUs: host cores x cpu_overcommit_ratio.

Requests that do not fit wait in a bounded FIFO queue; a full queue, or a wait longer than the
timeout, raises VmCapacityError. Background work (pool refills, snapshot builds) only gets a
ticket while no foreground request waits, and a waiting foreground request can reclaim capacity
from idle pooled VMs through the `reclaim` callback.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import VmCapacityError


@dataclass(frozen=True)
class Budget:
    max_vms: int
    memory_mb: int
    vcpus: int

    @classmethod
    def for_host(cls, max_vms: int, memory_ratio: float, cpu_ratio: float) -> Budget:
        host_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
        cores = os.cpu_count() or 1
        return cls(
            max_vms=max_vms,
            memory_mb=max(1, int(host_mb * memory_ratio)),
            vcpus=max(1, int(cores * cpu_ratio)),
        )


@dataclass(eq=False)
class Ticket:
    """One VM's share of the budgets. Release exactly once (release() is idempotent)."""

    memory_mb: int
    vcpus: int
    _owner: Admission | None = field(default=None, repr=False)

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._release(self)


@dataclass(eq=False)
class _Waiter:
    memory_mb: int
    vcpus: int
    background: bool
    future: asyncio.Future[Ticket]
    order: int


class Admission:
    def __init__(
        self,
        budget: Budget,
        *,
        max_waiters: int,
        wait_timeout: float,
        reclaim: Callable[[], bool] | None = None,
    ) -> None:
        self.budget = budget
        self.max_waiters = max_waiters
        self.wait_timeout = wait_timeout
        self._reclaim = reclaim
        self._vms = 0
        self._memory = 0
        self._vcpus = 0
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()
        self._closed = False
        self._waking = False
        self._again = False

    @property
    def in_use(self) -> tuple[int, int, int]:
        """(VMs, guest MB, vCPUs) granted now."""
        return self._vms, self._memory, self._vcpus

    @property
    def foreground_waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.background)

    def set_reclaim(self, reclaim: Callable[[], bool]) -> None:
        self._reclaim = reclaim

    def try_acquire(self, memory_mb: int, vcpus: int) -> Ticket | None:
        """A ticket now if it fits and nobody waits ahead, else None (never waits)."""
        if self._closed or self._waiters or not self._fits(memory_mb, vcpus):
            return None
        return self._grant(memory_mb, vcpus)

    async def acquire(self, memory_mb: int, vcpus: int, *, background: bool = False) -> Ticket:
        """Wait for a ticket. Foreground requests are served in FIFO order and before any
        background one; raises VmCapacityError when the queue is full or the wait times out.
        Background requests wait without a timeout (they are cancelled by their owner)."""
        if self._closed:
            raise VmCapacityError("the scheduler is closing")
        if memory_mb > self.budget.memory_mb or vcpus > self.budget.vcpus:
            raise VmCapacityError(
                f"a VM of {memory_mb} MB / {vcpus} vCPU can never fit this host's budget "
                f"({self.budget.memory_mb} MB / {self.budget.vcpus} vCPUs)"
            )
        if not self._waiters_ahead(background):
            if not background and not self._fits(memory_mb, vcpus) and self._reclaim:
                while not self._fits(memory_mb, vcpus) and self._reclaim():
                    pass
            if self._fits(memory_mb, vcpus):
                return self._grant(memory_mb, vcpus)
        if not background and self.foreground_waiting >= self.max_waiters:
            raise VmCapacityError(
                f"admission queue full: {self._vms} VMs running and {self.foreground_waiting} "
                f"requests waiting (max_concurrent_vms={self.budget.max_vms})"
            )
        waiter = _Waiter(
            memory_mb,
            vcpus,
            background,
            asyncio.get_running_loop().create_future(),
            next(self._order),
        )
        self._waiters.append(waiter)
        if not background:
            self._wake()  # may reclaim idle pooled VMs for it at once
        try:
            if background:
                return await waiter.future
            try:
                return await asyncio.wait_for(asyncio.shield(waiter.future), self.wait_timeout)
            except TimeoutError:
                raise VmCapacityError(
                    f"no capacity for a new VM within {self.wait_timeout:.0f} s "
                    f"({self._vms} VMs running, max_concurrent_vms={self.budget.max_vms})"
                ) from None
        except BaseException:
            self._abandon(waiter)
            raise

    def close(self) -> None:
        """Fail every waiter; later acquires raise VmCapacityError."""
        self._closed = True
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(VmCapacityError("the scheduler is closing"))
                waiter.future.exception()
        self._waiters.clear()

    # --- internals ---

    def _fits(self, memory_mb: int, vcpus: int) -> bool:
        return (
            self._vms + 1 <= self.budget.max_vms
            and self._memory + memory_mb <= self.budget.memory_mb
            and self._vcpus + vcpus <= self.budget.vcpus
        )

    def _waiters_ahead(self, background: bool) -> bool:
        # Foreground requests queue only behind other foreground requests; background ones
        # behind everybody.
        return any(not w.background for w in self._waiters) or (background and bool(self._waiters))

    def _grant(self, memory_mb: int, vcpus: int) -> Ticket:
        self._vms += 1
        self._memory += memory_mb
        self._vcpus += vcpus
        return Ticket(memory_mb, vcpus, self)

    def _release(self, ticket: Ticket) -> None:
        self._vms -= 1
        self._memory -= ticket.memory_mb
        self._vcpus -= ticket.vcpus
        self._wake()

    def _abandon(self, waiter: _Waiter) -> None:
        """The waiter gave up (timeout, cancellation, closing): drop it, and give back a ticket
        granted to it in the meantime."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        fut = waiter.future
        if not fut.done():
            fut.cancel()
        elif not fut.cancelled() and fut.exception() is None:
            fut.result().release()
        self._wake()

    def _wake(self) -> None:
        """Grant tickets to waiters in order. Re-entrant calls (a reclaimed VM releases its
        ticket from inside this method) just ask the running call for another pass."""
        if self._closed:
            return
        if self._waking:
            self._again = True
            return
        self._waking = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._grant_in_order()
        finally:
            self._waking = False

    def _grant_in_order(self) -> None:
        """Foreground waiters first (FIFO), then background ones, and nobody overtakes the first
        waiter that does not fit; a foreground waiter that does not fit reclaims pooled VMs."""
        for waiter in sorted(self._waiters, key=lambda w: (w.background, w.order)):
            if waiter.future.done():
                continue
            if not self._fits(waiter.memory_mb, waiter.vcpus) and not waiter.background:
                self._reclaim_for(waiter)
            if not self._fits(waiter.memory_mb, waiter.vcpus):
                return
            waiter.future.set_result(self._grant(waiter.memory_mb, waiter.vcpus))
            self._waiters.remove(waiter)

    def _reclaim_for(self, waiter: _Waiter) -> None:
        """Ask the pool to give back idle VMs until the waiter fits or none is left."""
        if self._reclaim is None:
            return
        while not self._fits(waiter.memory_mb, waiter.vcpus):
            if not self._reclaim():
                return
