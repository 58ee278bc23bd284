"""The warm pool's orchestration (pool.py) without VMs: targets that fit admission, per-language
sizes, and `wait_ready()` returning or raising instead of waiting for what cannot happen.

The VMs here are STAND-INS: the factory returns `_StandInVm` objects (alive, closable) instead of
starting QEMU, so these tests prove the pool's bookkeeping against a real `Admission`, not that a
pooled VM works (tests/integration/functional/test_warm_pool.py and test_speed_tiers.py do that
with real VMs). The `asyncio.wait_for` bounds below only turn a hang into a failure; nothing
asserts how long anything took."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from exec_sandbox import SchedulerConfig, VmConfigError, VmPermanentError
from exec_sandbox.errors import SandboxError, VmTransientError
from exec_sandbox.models import Language
from exec_sandbox.provisioning import pool as pool_module
from exec_sandbox.provisioning.admission import Admission, Budget
from exec_sandbox.provisioning.pool import WarmPool, fit_sizes

HANG_GUARD_SECONDS = 30.0


class _StandInVm:
    """What the pool needs of a GuestVm: `alive` and `close()`."""

    def __init__(self) -> None:
        self.alive = True

    def close(self) -> None:
        self.alive = False

    async def aclose(self) -> None:
        self.close()


async def _quiet() -> None:
    return None


@asynccontextmanager
async def running_pool(
    size: Any,
    budget: Budget,
    *,
    memory_mb: int = 100,
    factory: Callable[[Language], Any] | None = None,
    started: list[Language] | None = None,
) -> AsyncIterator[WarmPool]:
    admission = Admission(budget, max_waiters=4, wait_timeout=5.0)

    async def stand_in_factory(language: Language) -> tuple[Any, bool]:
        if started is not None:
            started.append(language)
        return _StandInVm(), False

    pool = WarmPool(size, memory_mb, 1, admission, factory or stand_in_factory, _quiet)
    admission.set_reclaim(pool.reclaim_one)
    pool.start()
    try:
        yield pool
    finally:
        await pool.close()
        admission.close()
        assert admission.in_use == (0, 0, 0)  # every ticket went back


async def test_pool_asked_for_more_than_admission_admits_is_cut_and_fills(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The case: 2 per language (6 VMs) on a host whose admission admits 4.
    caplog.set_level(logging.WARNING, logger="exec_sandbox")
    async with running_pool(2, Budget(max_vms=4, memory_mb=100_000, vcpus=4)) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert pool.sizes == {"python": 2, "javascript": 1, "raw": 1}
        assert pool.idle_count == 4
        assert pool._admission.in_use[0] == 4
    assert "admission admits at most 4" in caplog.text
    assert "python 2, javascript 1, raw 1" in caplog.text


async def test_pool_targets_are_cut_by_guest_ram_and_vcpus_too() -> None:
    by_memory = Budget(max_vms=100, memory_mb=250, vcpus=100)
    assert sum(fit_sizes({"python": 3, "javascript": 3, "raw": 3}, 100, 1, by_memory).values()) == 2
    by_cpu = Budget(max_vms=100, memory_mb=100_000, vcpus=3)
    assert fit_sizes({"python": 3, "javascript": 3, "raw": 3}, 100, 2, by_cpu) == {
        "python": 1,
        "javascript": 0,
        "raw": 0,
    }


async def test_a_pool_that_fits_is_not_cut(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exec_sandbox")
    async with running_pool(1, Budget(max_vms=3, memory_mb=100_000, vcpus=3)) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert pool.sizes == {"python": 1, "javascript": 1, "raw": 1}
    assert "warm pool" not in caplog.text


async def test_per_language_sizes_pool_only_those_languages() -> None:
    started: list[Language] = []
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"python": 2}, budget, started=started) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert started == ["python", "python"]
        assert pool.take("javascript") is None
        taken = pool.take("python")
        assert taken is not None
        taken.lease.discard()  # the VM and its ticket, as a request ends them
        # The refill replaces it.
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert started == ["python"] * 3


async def test_a_host_that_admits_no_pooled_vm_disables_the_pool() -> None:
    async with running_pool(1, Budget(max_vms=4, memory_mb=50, vcpus=4)) as pool:
        assert pool.total == 0
        assert not pool.matches(100, False)
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)  # returns at once


@pytest.mark.parametrize(
    "error, raised",
    [
        (VmPermanentError("no QEMU"), VmPermanentError),
        (VmTransientError("boot timed out"), VmTransientError),
        (OSError(5, "EIO"), VmTransientError),
    ],
)
async def test_wait_ready_raises_when_vms_keep_failing_to_start(
    monkeypatch: pytest.MonkeyPatch, error: Exception, raised: type[Exception]
) -> None:
    monkeypatch.setattr(pool_module, "_RETRY_FIRST_SECONDS", 0.0)
    attempts = 0

    async def failing(language: Language) -> tuple[Any, bool]:
        nonlocal attempts
        attempts += 1
        raise error

    budget = Budget(max_vms=4, memory_mb=100_000, vcpus=4)
    async with running_pool({"python": 1}, budget, factory=failing) as pool:
        with pytest.raises(raised, match="failed 3 times in a row") as info:
            await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert info.value.__cause__ is error
        assert attempts >= pool_module.GIVE_UP_AFTER_FAILURES


async def test_wait_ready_raises_when_the_pool_is_closed() -> None:
    budget = Budget(max_vms=4, memory_mb=100_000, vcpus=4)
    gate = asyncio.Event()

    async def never_done(language: Language) -> tuple[Any, bool]:
        await gate.wait()
        return _StandInVm(), False

    async with running_pool(1, budget, factory=never_done) as pool:
        waiter = asyncio.create_task(pool.wait_ready())
        await asyncio.sleep(0)
        await pool.close()
        with pytest.raises(SandboxError, match="closed"):
            await asyncio.wait_for(waiter, HANG_GUARD_SECONDS)


def test_config_accepts_per_language_sizes_and_refuses_bad_ones() -> None:
    assert SchedulerConfig(warm_pool_size={"python": 2}).warm_pool_size == {"python": 2}
    assert SchedulerConfig(warm_pool_size=3).warm_pool_size == 3
    for bad in ({"ruby": 1}, {"python": -1}, {"python": True}, {"python": 65}, "2", 2.0):
        with pytest.raises(VmConfigError):
            SchedulerConfig(warm_pool_size=bad)  # type: ignore[arg-type]
