"""process.spawn() starts QEMU on the spawner thread, one start at a time;
a spawn whose owner closed while it waited forks nothing; a spawn cancelled during its fork waits
for the fork (the caller then closes fds the child reads) and releases what it made. The fork is
a stand-in here (`start_qemu` replaced by a function that blocks the spawner thread until the
test lets it go); real forks are covered by the VM suites."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from exec_sandbox.errors import SandboxError
from exec_sandbox.vm import process
from exec_sandbox.vm.registry import VmRegistry


class FakeVm:
    """What spawn() and release() use of the C core's Vm."""

    pidfd = -1
    spawn_fd = -1

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid = 0
        self.killed = False
        self.closed = False

    def check_spawn(self) -> bool:
        return True

    def kill(self) -> None:
        self.killed = True

    def close(self) -> None:
        self.closed = True


class Forks:
    """start_qemu stand-in: records each fork and holds it until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.made: list[FakeVm] = []
        self.gates: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def __call__(self, spec: Any, *, incoming: bool) -> FakeVm:
        with self.lock:
            self.started.append(spec)
            gate = self.gates.setdefault(spec, threading.Event())
        assert gate.wait(10)
        vm = FakeVm(spec)
        self.made.append(vm)
        return vm

    def let_go(self, name: str) -> None:
        with self.lock:
            self.gates.setdefault(name, threading.Event()).set()


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> Forks:
    fake = Forks()
    monkeypatch.setattr(process, "start_qemu", fake)
    return fake


async def _until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_one_fork_at_a_time_and_the_loop_runs_meanwhile(forks: Forks) -> None:
    first = asyncio.ensure_future(process.spawn("a", incoming=False, registry=None))  # type: ignore[arg-type]
    second = asyncio.ensure_future(process.spawn("b", incoming=False, registry=None))  # type: ignore[arg-type]
    await _until(lambda: forks.started == ["a"])
    ticks = 0
    for _ in range(10):  # the loop is free while "a" forks
        await asyncio.sleep(0.005)
        ticks += 1
    assert ticks == 10 and forks.started == ["a"]  # "b" waits for its turn
    forks.let_go("a")
    await _until(lambda: forks.started == ["a", "b"])
    forks.let_go("b")
    assert [vm.name for vm in await asyncio.gather(first, second)] == ["a", "b"]


async def test_a_spawn_whose_owner_closed_while_it_waited_forks_nothing(forks: Forks) -> None:
    registry = VmRegistry()
    first = asyncio.ensure_future(process.spawn("a", incoming=False, registry=registry))  # type: ignore[arg-type]
    second = asyncio.ensure_future(process.spawn("b", incoming=False, registry=registry))  # type: ignore[arg-type]
    await _until(lambda: forks.started == ["a"])
    registry.close()
    forks.let_go("a")
    for task in (first, second):
        with pytest.raises(SandboxError):
            await task
    assert forks.started == ["a"]  # "b" never forked
    assert forks.made[0].killed  # "a" was made during the close: released at once
    await registry.wait_started()
    await process.wait_released()


async def test_a_spawn_cancelled_during_its_fork_waits_for_it_and_releases_it(
    forks: Forks,
) -> None:
    registry = VmRegistry()
    task = asyncio.ensure_future(process.spawn("a", incoming=False, registry=registry))  # type: ignore[arg-type]
    await _until(lambda: forks.started == ["a"])
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for the fork, which reads the caller's fds
    forks.let_go("a")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert forks.made[0].killed  # released, not left running
    await process.wait_released()
    assert forks.made[0].closed
    await registry.wait_started()  # nothing left starting
