"""Admission control (admission.py) without VMs: budgets, FIFO order, bounded queue, timeouts,
background work yielding to foreground requests, reclaiming pooled VMs."""

from __future__ import annotations

import asyncio

import pytest

from exec_sandbox import SchedulerConfig, VmCapacityError, VmConfigError
from exec_sandbox.provisioning.admission import Admission, Budget


def make(
    max_vms: int = 2,
    memory_mb: int = 1000,
    vcpus: int = 8,
    *,
    waiters: int = 4,
    timeout: float = 5.0,
) -> Admission:
    return Admission(Budget(max_vms, memory_mb, vcpus), max_waiters=waiters, wait_timeout=timeout)


async def test_grants_until_each_budget_is_used() -> None:
    by_count = make(max_vms=2)
    a, b = await by_count.acquire(100, 1), await by_count.acquire(100, 1)
    assert by_count.try_acquire(100, 1) is None
    assert by_count.in_use == (2, 200, 2)
    a.release()
    a.release()  # idempotent: counted once
    assert by_count.in_use == (1, 100, 1)
    b.release()

    by_memory = make(max_vms=10, memory_mb=300)
    t1 = await by_memory.acquire(200, 1)
    assert by_memory.try_acquire(200, 1) is None
    assert by_memory.try_acquire(100, 1) is not None
    t1.release()

    by_cpu = make(max_vms=10, vcpus=2)
    await by_cpu.acquire(10, 2)
    assert by_cpu.try_acquire(10, 1) is None


async def test_waiters_are_served_in_order_when_capacity_returns() -> None:
    adm = make(max_vms=1)
    first = await adm.acquire(100, 1)
    order: list[int] = []

    async def wait(n: int) -> None:
        ticket = await adm.acquire(100, 1)
        order.append(n)
        await asyncio.sleep(0)
        ticket.release()

    tasks = [asyncio.create_task(wait(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert order == []
    first.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert adm.in_use == (0, 0, 0)


async def test_full_queue_raises_capacity_error_at_once() -> None:
    adm = make(max_vms=1, waiters=2)
    held = await adm.acquire(100, 1)
    waiting = [asyncio.create_task(adm.acquire(100, 1)) for _ in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(VmCapacityError, match="queue full"):
        await adm.acquire(100, 1)
    held.release()
    for task in waiting:
        (await task).release()
    assert adm.in_use == (0, 0, 0)


async def test_wait_timeout_raises_capacity_error_and_keeps_no_ticket() -> None:
    adm = make(max_vms=1, timeout=0.05)
    held = await adm.acquire(100, 1)
    with pytest.raises(VmCapacityError, match="within"):
        await adm.acquire(100, 1)
    held.release()
    assert adm.in_use == (0, 0, 0)
    assert adm.foreground_waiting == 0


async def test_a_vm_larger_than_the_budget_is_refused() -> None:
    with pytest.raises(VmCapacityError, match="never fit"):
        await make(memory_mb=100).acquire(200, 1)


async def test_cancelled_waiter_leaves_no_ticket_behind() -> None:
    adm = make(max_vms=1)
    held = await adm.acquire(100, 1)
    task = asyncio.create_task(adm.acquire(100, 1))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    held.release()
    assert adm.in_use == (0, 0, 0)


async def test_background_work_waits_while_foreground_requests_wait() -> None:
    adm = make(max_vms=1)
    held = await adm.acquire(100, 1)
    background = asyncio.create_task(adm.acquire(100, 1, background=True))
    await asyncio.sleep(0.01)
    foreground = asyncio.create_task(adm.acquire(100, 1))
    await asyncio.sleep(0.01)
    held.release()
    fg_ticket = await foreground  # the later foreground request overtakes the background one
    assert not background.done()
    fg_ticket.release()
    (await background).release()
    # Background never overtakes: with a foreground waiter queued, try_acquire refuses too.
    assert adm.in_use == (0, 0, 0)


async def test_foreground_waiter_reclaims_idle_pooled_vms() -> None:
    adm = make(max_vms=2)
    pooled = [await adm.acquire(100, 1, background=True) for _ in range(2)]
    reclaimed: list[int] = []

    def reclaim() -> bool:
        if not pooled:
            return False
        pooled.pop().release()
        reclaimed.append(1)
        return True

    adm.set_reclaim(reclaim)
    ticket = await asyncio.wait_for(adm.acquire(100, 1), 1)
    assert reclaimed == [1] and len(pooled) == 1
    ticket.release()
    pooled.pop().release()
    assert adm.in_use == (0, 0, 0)


async def test_close_fails_waiters() -> None:
    adm = make(max_vms=1)
    await adm.acquire(100, 1)
    task = asyncio.create_task(adm.acquire(100, 1))
    await asyncio.sleep(0.01)
    adm.close()
    with pytest.raises(VmCapacityError, match="closing"):
        await task
    with pytest.raises(VmCapacityError):
        await adm.acquire(100, 1)


def test_budget_for_host_applies_the_overcommit_ratios() -> None:
    import os

    budget = Budget.for_host(7, 2.0, 3.0)
    host_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    assert budget.max_vms == 7
    assert budget.memory_mb == host_mb * 2
    assert budget.vcpus == (os.cpu_count() or 1) * 3


@pytest.mark.parametrize(
    "field,value",
    [
        ("admission_queue_size", -1),
        ("admission_queue_size", 1.5),
        ("admission_timeout_seconds", 0),
        ("admission_timeout_seconds", True),
        ("memory_snapshots", "yes"),
    ],
)
def test_new_config_fields_are_validated(field: str, value: object) -> None:
    with pytest.raises(VmConfigError, match=field):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]
