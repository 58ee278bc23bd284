"""A Lease owns a VM and its admission ticket and ends both once (lease.py), with a real
`Admission`. The VMs are STAND-INS that only count their close() calls: these tests prove the
lease's bookkeeping, not anything about a VM."""

from __future__ import annotations

import asyncio

import pytest

from exec_sandbox.errors import VmTransientError
from exec_sandbox.provisioning.admission import Admission, Budget
from exec_sandbox.provisioning.lease import Lease


class _StandInVm:
    def __init__(self) -> None:
        self.closes = 0
        self.reaped = False

    def close(self) -> None:
        self.closes += 1

    async def aclose(self) -> None:
        self.close()
        self.reaped = True


def _admission() -> Admission:
    return Admission(Budget(max_vms=2, memory_mb=1000, vcpus=2), max_waiters=2, wait_timeout=1.0)


async def test_discard_closes_the_vm_and_returns_the_ticket_once() -> None:
    admission = _admission()
    holder: set[Lease[_StandInVm]] = set()
    vm = _StandInVm()
    lease = Lease(vm, await admission.acquire(100, 1), holder)
    assert holder == {lease} and admission.in_use == (1, 100, 1)
    lease.discard()
    lease.discard()
    await lease.release()
    assert admission.in_use == (0, 0, 0)
    assert holder == set()
    assert lease.ended
    # release() after discard() still waits for the reap; the VM is closed again only
    # through its own idempotent close() (aclose), never by the lease a second time.
    assert vm.closes == 2 and vm.reaped


async def test_acquire_returns_the_ticket_when_the_vm_cannot_be_started() -> None:
    admission = _admission()
    holder: set[Lease[_StandInVm]] = set()

    async def failing_start() -> _StandInVm:
        raise VmTransientError("stand-in: QEMU did not start")

    with pytest.raises(VmTransientError):
        await Lease.acquire(await admission.acquire(100, 1), failing_start, holder)
    assert admission.in_use == (0, 0, 0)
    assert holder == set()


async def test_acquire_returns_the_ticket_when_the_caller_is_cancelled() -> None:
    admission = _admission()
    started = asyncio.Event()

    async def slow_start() -> _StandInVm:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    task = asyncio.ensure_future(Lease.acquire(await admission.acquire(100, 1), slow_start))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert admission.in_use == (0, 0, 0)


async def test_move_to_hands_the_lease_to_another_owner() -> None:
    admission = _admission()
    pool: set[Lease[_StandInVm]] = set()
    scheduler: set[Lease[_StandInVm]] = set()
    lease = Lease(_StandInVm(), await admission.acquire(100, 1), pool)
    lease.move_to(scheduler)
    assert pool == set() and scheduler == {lease}
    lease.discard()
    assert scheduler == set() and admission.in_use == (0, 0, 0)
