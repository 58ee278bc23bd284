"""How ClusterScheduler maps a lost host (a Ray failure) to the library's errors, against fake
host calls (no Ray cluster, no VM): before a call started -> VmTransientError, retried once on
another host; after -> CommunicationOutcomeUnknownError, never retried; sessions -> closed."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

if os.environ.get("EXEC_SANDBOX_SKIP_CLUSTER_TESTS") == "1":
    pytest.skip("EXEC_SANDBOX_SKIP_CLUSTER_TESTS=1 set by the caller", allow_module_level=True)

from exec_sandbox import (
    CommunicationOutcomeUnknownError,
    ExecutionResult,
    InputValidationError,
    SessionClosedError,
    VmCapacityError,
    VmTransientError,
)
from exec_sandbox.cluster import (
    ClusterScheduler,
    _ray,
)
from exec_sandbox.cluster import client as client_module
from exec_sandbox.scheduler import HostCapacity

Script = Callable[[], AsyncIterator[tuple[str, Any]]]


def _info(name: str, free: int) -> client_module.HostInfo:
    capacity = HostCapacity(
        max_vms=1,
        vms_in_use=1 - free,
        free_vms=free,
        free_memory_mb=1,
        free_vcpus=1,
        waiting=0,
        warm_pool={},
        sessions=0,
    )
    return client_module.HostInfo(
        name=name,
        hostname="h",
        pid=1,
        accelerator="tcg",
        capacity=capacity,
        sessions=0,
        runs=0,
        uptime_seconds=0,
    )


def _lost() -> Exception:
    return _ray.RayError("the actor died")


async def _items(*steps: Any) -> AsyncIterator[tuple[str, Any]]:
    for step in steps:
        if isinstance(step, BaseException):
            raise step
        yield step


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterScheduler, dict[str, list[Any]]]:
    """Two hosts, a (best, free) and b; `plans[host]` lists, per call, the items it streams."""
    scheduler = ClusterScheduler(address="fake")
    scheduler._started = True
    scheduler._hosts = {
        name: client_module._Host(name, handle=name, info=_info(name, free))
        for name, free in (("sandbox-host-a", 1), ("sandbox-host-b", 0))
    }
    plans: dict[str, list[Any]] = {"sandbox-host-a": [], "sandbox-host-b": []}
    calls: list[str] = []

    async def no_refresh(force: bool = False) -> None:
        return None

    def stream(handle: str, method: str, *args: Any) -> AsyncIterator[tuple[str, Any]]:
        calls.append(handle)
        return _items(*plans[handle].pop(0))

    monkeypatch.setattr(scheduler, "_refresh", no_refresh)
    monkeypatch.setattr(_ray, "stream", stream)
    plans["calls"] = calls
    return scheduler, plans


OK = ExecutionResult(stdout="1\n", stderr="", exit_code=0)


async def test_run_lost_before_it_started_is_retried_once_on_another_host(cluster: Any) -> None:
    scheduler, plans = cluster
    plans["sandbox-host-a"].append([_lost()])
    plans["sandbox-host-b"].append([("started", None), ("ok", OK)])
    assert await scheduler.run("print(1)") == OK
    assert plans["calls"] == ["sandbox-host-a", "sandbox-host-b"]


async def test_run_lost_before_it_started_twice_is_a_transient_error(cluster: Any) -> None:
    scheduler, plans = cluster
    plans["sandbox-host-a"].append([_lost()])
    plans["sandbox-host-b"].append([_lost()])
    with pytest.raises(VmTransientError):
        await scheduler.run("print(1)")


async def test_run_lost_after_it_started_is_outcome_unknown_and_not_retried(cluster: Any) -> None:
    scheduler, plans = cluster
    plans["sandbox-host-a"].append([("started", None), _lost()])
    with pytest.raises(CommunicationOutcomeUnknownError):
        await scheduler.run("print(1)")
    assert plans["calls"] == ["sandbox-host-a"]


async def test_run_moves_to_the_next_host_when_one_refuses(cluster: Any) -> None:
    scheduler, plans = cluster
    plans["sandbox-host-a"].append([("started", None), ("err", VmCapacityError("full"))])
    plans["sandbox-host-b"].append([("started", None), ("ok", OK)])
    assert await scheduler.run("print(1)") == OK


async def test_run_raises_capacity_error_only_when_every_host_refuses(cluster: Any) -> None:
    scheduler, plans = cluster
    for _ in range(2):  # once refusing at once, once after queueing
        for host in ("sandbox-host-a", "sandbox-host-b"):
            plans[host].append([("started", None), ("err", VmCapacityError("full"))])
    with pytest.raises(VmCapacityError, match="every host refused"):
        await scheduler.run("print(1)")
    assert len(plans["calls"]) == 4


async def test_exec_lost_after_it_started_is_outcome_unknown_then_session_closed(
    cluster: Any,
) -> None:
    scheduler, plans = cluster
    info = {
        "id": "sandbox-host-a/s1",
        "host": "sandbox-host-a",
        "language": "python",
        "warm_pool_hit": False,
        "l1_cache_hit": False,
        "packages": None,
        "exec_count": 0,
    }
    session = scheduler._adopt(scheduler._hosts["sandbox-host-a"], info, None, None, owned=True)
    plans["sandbox-host-a"].append([("started", None), _lost()])
    with pytest.raises(CommunicationOutcomeUnknownError):
        await session.exec("x = 1")
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.exec("print(x)")
    assert plans["calls"] == ["sandbox-host-a"]  # never retried


async def test_volumes_are_refused_before_any_host_is_asked(cluster: Any) -> None:
    scheduler, plans = cluster
    with pytest.raises(InputValidationError, match="does not support volumes"):
        await scheduler.run("print(1)", volumes={"/mnt/data": "data"})
    with pytest.raises(InputValidationError, match="does not support volumes"):
        await scheduler.session(volumes={"/mnt/data": "data"})
    assert plans["calls"] == []
