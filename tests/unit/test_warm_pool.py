"""The warm pool's orchestration (pool.py) without VMs: targets that fit admission, per-language
and per-template sizes, what a pooled VM serves, template pools that wait for their template,
and `wait_ready()` returning or raising instead of waiting for what cannot happen.

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
from exec_sandbox.models import Language, Template
from exec_sandbox.provisioning import pool as pool_module
from exec_sandbox.provisioning.admission import Admission, Budget
from exec_sandbox.provisioning.pool import (
    PoolKey,
    PoolShape,
    WarmPool,
    fit_sizes,
    requested_sizes,
)

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


PY, JS, RAW = PoolKey("python"), PoolKey("javascript"), PoolKey("raw")


def _template(name: str, build: int = 1, **fields: Any) -> Template:
    values: dict[str, Any] = {
        "name": name,
        "digest": f"sha256:{build:064x}",
        "size_bytes": 4096,
        "languages": {"raw": "sh"},
        "env": {},
        "workdir": "/",
    }
    values.update(fields)
    return Template(**values)


class _Store:
    """What the pool needs of the template store: the template of a name now, or None."""

    def __init__(self, *templates: Template) -> None:
        self.templates = {t.name: t for t in templates}
        self.lookups: list[str] = []

    async def get(self, name: str) -> Template | None:
        self.lookups.append(name)
        return self.templates.get(name)


def _shapes(requested: dict[PoolKey, int], memory_mb: int, vcpus: int) -> dict[PoolKey, PoolShape]:
    return {key: PoolShape(memory_mb, vcpus) for key in requested}


@asynccontextmanager
async def running_pool(
    size: Any,
    budget: Budget,
    *,
    memory_mb: int = 100,
    factory: Callable[[Language, PoolShape], Any] | None = None,
    started: list[Language] | None = None,
    store: _Store | None = None,
) -> AsyncIterator[WarmPool]:
    admission = Admission(budget, max_waiters=4, wait_timeout=5.0)

    async def stand_in_factory(language: Language, shape: PoolShape) -> tuple[Any, bool]:
        if started is not None:
            started.append(language)
        return _StandInVm(), False

    pool = WarmPool(
        size,
        memory_mb,
        1,
        admission,
        factory or stand_in_factory,
        _quiet,
        None if store is None else store.get,
    )
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
        assert pool.sizes == {PY: 2, JS: 1, RAW: 1}
        assert pool.idle_count == 4
        assert pool._admission.in_use[0] == 4
    assert "admission admits at most 4" in caplog.text
    assert "python 2, javascript 1, raw 1" in caplog.text


async def test_pool_targets_are_cut_by_guest_ram_and_vcpus_too() -> None:
    requested = {PY: 3, JS: 3, RAW: 3}
    by_memory = Budget(max_vms=100, memory_mb=250, vcpus=100)
    assert sum(fit_sizes(requested, _shapes(requested, 100, 1), by_memory).values()) == 2
    by_cpu = Budget(max_vms=100, memory_mb=100_000, vcpus=3)
    assert fit_sizes(requested, _shapes(requested, 100, 2), by_cpu) == {PY: 1, JS: 0, RAW: 0}


async def test_a_pool_that_fits_is_not_cut(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exec_sandbox")
    async with running_pool(1, Budget(max_vms=3, memory_mb=100_000, vcpus=3)) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert pool.sizes == {PY: 1, JS: 1, RAW: 1}
    assert "warm pool" not in caplog.text


async def test_per_language_sizes_pool_only_those_languages() -> None:
    started: list[Language] = []
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"python": 2}, budget, started=started) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert started == ["python", "python"]
        assert pool.take(JS, 100, 1, None) is None
        taken = pool.take(PY, 100, 1, None)
        assert taken is not None
        taken.lease.discard()  # the VM and its ticket, as a request ends them
        # The refill replaces it.
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert started == ["python"] * 3


async def test_a_host_that_admits_no_pooled_vm_disables_the_pool() -> None:
    async with running_pool(1, Budget(max_vms=4, memory_mb=50, vcpus=4)) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)  # returns at once
        assert pool.total == 0
        assert pool.take(PY, 100, 1, None) is None


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

    async def failing(language: Language, shape: PoolShape) -> tuple[Any, bool]:
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

    async def never_done(language: Language, shape: PoolShape) -> tuple[Any, bool]:
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


def test_config_accepts_template_pools_and_refuses_bad_keys() -> None:
    sizes = {"python": 2, "go-dev:raw": 1, "ds.v2:python": 3}
    assert SchedulerConfig(warm_pool_size=sizes).warm_pool_size == sizes
    for bad in ({"Go:raw": 1}, {"go:ruby": 1}, {":raw": 1}, {"a:b:raw": 1}, {"go:raw": -1}):
        with pytest.raises(VmConfigError):
            SchedulerConfig(warm_pool_size=bad)
    with pytest.raises(VmConfigError):
        SchedulerConfig(warm_pool_size={1: 1})  # type: ignore[dict-item]


def test_an_int_pools_every_language_of_the_default_image_only() -> None:
    assert requested_sizes(2) == {PY: 2, JS: 2, RAW: 2}
    assert requested_sizes({"go-dev:raw": 1, "python": 1}) == {
        PY: 1,
        JS: 0,
        RAW: 0,
        PoolKey("raw", "go-dev"): 1,
    }
    assert [str(key) for key in requested_sizes({"go-dev:raw": 1})] == [
        "python",
        "javascript",
        "raw",
        "go-dev:raw",
    ]


def test_template_pools_count_with_their_own_ram_in_the_fit() -> None:
    big = PoolKey("python", "big")
    requested = {PY: 1, JS: 0, RAW: 0, big: 3}
    shapes = {**_shapes(requested, 100, 1), big: PoolShape(400, 1)}
    budget = Budget(max_vms=100, memory_mb=1000, vcpus=100)
    # python's 100 MB, then two of big's 400 MB: a third would not fit.
    assert fit_sizes(requested, shapes, budget) == {PY: 1, JS: 0, RAW: 0, big: 2}


async def test_a_template_pool_starts_vms_of_the_templates_defaults_and_serves_that_shape() -> None:
    template = _template("go-dev", memory_mb=300, vcpus=2)
    shapes: list[PoolShape] = []

    async def factory(language: Language, shape: PoolShape) -> tuple[Any, bool]:
        shapes.append(shape)
        return _StandInVm(), False

    key = PoolKey("raw", "go-dev")
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    store = _Store(template)
    async with running_pool({"go-dev:raw": 1}, budget, factory=factory, store=store) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert shapes == [PoolShape(300, 2, template)]
        assert pool._admission.in_use == (1, 300, 2)  # its ticket is of the template's size
        assert pool.take(PoolKey("raw"), 300, 2, None) is None  # the default image's pool
        assert pool.take(key, 192, 2, template.digest) is None  # a call with its own RAM
        assert pool.take(key, 300, 1, template.digest) is None  # ... or vCPUs
        taken = pool.take(key, 300, 2, template.digest)
        assert taken is not None and taken.shape.digest == template.digest
        taken.lease.discard()


async def test_a_template_without_defaults_gets_the_pools_ram_and_vcpus() -> None:
    template = _template("plain")
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"plain:raw": 1}, budget, store=_Store(template)) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        taken = pool.take(PoolKey("raw", "plain"), 100, 1, template.digest)
        assert taken is not None
        taken.lease.discard()


async def test_a_pooled_vm_of_an_older_build_is_discarded_not_served() -> None:
    old, new = _template("go-dev", build=1), _template("go-dev", build=2)
    store = _Store(old)
    key = PoolKey("raw", "go-dev")
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"go-dev:raw": 1}, budget, store=store) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        stale = pool._idle[key][0]
        # Rebuilt by another process: the store has the new digest, the pool learns it from
        # the request.
        store.templates["go-dev"] = new
        assert pool.take(key, 100, 1, new.digest) is None
        assert not stale.vm.alive and stale.lease.ended
        # Its refill looks the template up again and starts one of the new build.
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        fresh = pool.take(key, 100, 1, new.digest)
        assert fresh is not None and fresh.shape.template == new
        fresh.lease.discard()


async def test_a_template_rebuilt_here_replaces_its_idle_vms_at_once() -> None:
    old, new = _template("go-dev", build=1), _template("go-dev", build=2, memory_mb=200)
    store = _Store(old)
    key = PoolKey("raw", "go-dev")
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"go-dev:raw": 1}, budget, store=store) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        stale = pool._idle[key][0]
        store.templates["go-dev"] = new
        pool.template_changed("go-dev", new)
        assert stale.lease.ended
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert [p.shape for p in pool._idle[key]] == [PoolShape(200, 1, new)]
        pool.template_changed("go-dev", None)  # deleted
        assert pool.idle_count == 0


@pytest.mark.parametrize(
    "templates",
    [(), (_template("go-dev", languages={"python": "3.12"}),)],
    ids=["not built", "lacks the language"],
)
async def test_wait_ready_does_not_wait_for_a_template_pool_without_its_template(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    templates: tuple[Template, ...],
) -> None:
    monkeypatch.setattr(pool_module, "_RETRY_FIRST_SECONDS", 0.01)
    monkeypatch.setattr(pool_module, "_RETRY_MAX_SECONDS", 0.01)
    caplog.set_level(logging.WARNING, logger="exec_sandbox")
    store = _Store(*templates)
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"python": 1, "go-dev:raw": 1}, budget, store=store) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert pool.idle_by_key() == {PY: 1, JS: 0, RAW: 0, PoolKey("raw", "go-dev"): 0}
        while len(store.lookups) < 4:  # the refill keeps looking...
            await asyncio.sleep(0.01)
        # ... and says so once.
        assert caplog.text.count("no template 'go-dev' with raw yet") == 1
        assert pool._failures[PoolKey("raw", "go-dev")] == 0  # waiting is not failing


async def test_a_template_pool_fills_once_its_template_is_built() -> None:
    # The backoff is long: only template_changed() (a build by this scheduler) can end it in time.
    store = _Store()
    key = PoolKey("raw", "go-dev")
    budget = Budget(max_vms=8, memory_mb=100_000, vcpus=8)
    async with running_pool({"go-dev:raw": 1}, budget, store=store) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        assert pool.idle_count == 0
        while not store.lookups:
            await asyncio.sleep(0)
        template = _template("go-dev")
        store.templates["go-dev"] = template
        pool.template_changed("go-dev", template)

        async def filled() -> None:
            while not pool._idle[key]:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(filled(), HANG_GUARD_SECONDS)
        assert pool._idle[key][0].shape.template == template


async def test_a_template_pool_too_big_for_the_host_is_cut_from_the_targets() -> None:
    huge = _template("huge", memory_mb=10_000)
    budget = Budget(max_vms=8, memory_mb=1_000, vcpus=8)
    async with running_pool({"python": 1, "huge:raw": 1}, budget, store=_Store(huge)) as pool:
        await asyncio.wait_for(pool.wait_ready(), HANG_GUARD_SECONDS)
        # Cut from the targets when the pool started: it never fits.
        assert pool.sizes[PoolKey("raw", "huge")] == 0 and pool.idle_count == 1
