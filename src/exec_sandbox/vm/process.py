"""Starting and releasing QEMU processes without blocking the loop.

`binding.start_qemu()` (the C core) returns once QEMU's process has taken its jail steps and exec'd
(or failed); `spawn()` runs it on the spawner thread and reads the outcome from the spawn error
pipe (`spawn_fd`). `release()` SIGKILLs
QEMU at once, awaits its pidfd, and leaves the reap, the fds and the cgroup's removal (which may
retry for a while when the kernel is slow to empty it) to an executor thread. Every such release
is tracked until it is done: `wait_released()` (Scheduler.close() awaits it) returns once none is
left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import weakref
from typing import Any

from ..errors import VmPermanentError, VmTransientError
from .binding import start_qemu
from .registry import VmRegistry
from .spec import VmSpec

# Releases in progress (see the module docstring), per loop.
_releasing: set[asyncio.Task[None]] = set()
# Every QEMU is started on this one thread, not the loop's: the C core's clone(CLONE_VM |
# CLONE_VFORK) holds the calling thread until the child's exec (its jail steps, a few ms), while
# the loop runs on in the same memory (no page tables copied, no copy-on-write faults). One
# thread for the process's life: PR_SET_PDEATHSIG ties each QEMU to the thread that started it,
# and this one ends only with the interpreter.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbx-spawn")
# One start in flight per loop: the others wait their turn here, on the loop, where their owner's
# close() still calls them off (queued on the executor, each would start a QEMU only to release
# it).
_fork_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _after_fork_in_child() -> None:
    """A child forked from this process (multiprocessing, a preforking server) has none of its
    threads: a fresh spawner, no lock held by a fork it will never see end."""
    global _spawner
    _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbx-spawn")
    _fork_locks.clear()
    _releasing.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Forking:
    """A QEMU being started on the spawner thread, in its owner's registry meanwhile: a close()
    of the registry marks it, and the fork's QEMU is then released as soon as it exists."""

    killed = False

    def kill(self) -> None:
        self.killed = True


async def readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Wait until fd is readable, through the loop."""
    ready: asyncio.Future[None] = loop.create_future()

    def on_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def spawn(spec: VmSpec, *, incoming: bool, registry: VmRegistry | None) -> Any:
    """A running QEMU for spec (the C core's Vm), its exec confirmed, killed by registry's
    close() while it starts. Raises VmPermanentError (no such binary) or VmTransientError;
    SandboxError when registry is closed."""
    loop = asyncio.get_running_loop()
    if registry is not None:
        registry.check_open()
    forking = _Forking()
    if registry is not None:
        registry.starting(forking)
    fork_lock = _fork_locks.setdefault(loop, asyncio.Lock())
    try:
        await fork_lock.acquire()
    except BaseException:
        _forked(registry, forking)
        raise
    try:
        if forking.killed and registry is not None:
            registry.check_open()  # closed while this spawn waited for its turn
        start = functools.partial(start_qemu, spec, incoming=incoming)
        fork = loop.run_in_executor(_spawner, start)
    except BaseException:
        fork_lock.release()
        _forked(registry, forking)
        raise
    fork.add_done_callback(lambda _: loop.call_soon(fork_lock.release))
    try:
        vm = await asyncio.shield(fork)
    except asyncio.CancelledError:
        # The fork goes on in its thread, reading fds the caller closes once this returns (a
        # template's RAM file): wait for it (milliseconds), then release the QEMU it made. The
        # registry counts it as starting until then (close() waits for it).
        try:
            await asyncio.wait({fork})
        finally:
            if fork.done():
                _abandoned(loop, registry, forking, fork)
            else:  # cancelled again while waiting: released when the fork ends
                fork.add_done_callback(functools.partial(_abandoned, loop, registry, forking))
        raise
    except FileNotFoundError as exc:
        _forked(registry, forking)
        raise VmPermanentError(f"cannot start QEMU: {exc}") from exc
    except OSError as exc:
        _forked(registry, forking)
        raise VmTransientError(f"cannot start QEMU: {exc}") from exc
    except BaseException:
        _forked(registry, forking)
        raise
    if registry is not None:
        registry.starting(vm)
    _forked(registry, forking)
    try:
        if forking.killed and registry is not None:
            registry.check_open()  # closed during the fork
        await wait_started(loop, vm)
        if registry is not None:
            registry.check_open()  # closed while QEMU was starting: it goes at once
    except BaseException:
        release(loop, vm)
        raise
    finally:
        if registry is not None:
            registry.started(vm)
    return vm


def _forked(registry: VmRegistry | None, forking: _Forking) -> None:
    if registry is not None:
        registry.started(forking)


def _abandoned(
    loop: asyncio.AbstractEventLoop,
    registry: VmRegistry | None,
    forking: _Forking,
    fork: asyncio.Future[Any],
) -> None:
    """The fork of a cancelled spawn() ended: release its QEMU, if it made one."""
    if not fork.cancelled() and fork.exception() is None:
        release(loop, fork.result())
    _forked(registry, forking)


async def wait_started(loop: asyncio.AbstractEventLoop, vm: Any) -> None:
    """Wait for QEMU's exec; the error the child reported before it, as VmPermanentError (no
    such binary) or VmTransientError."""
    while True:
        try:
            if vm.check_spawn():
                return
        except FileNotFoundError as exc:
            raise VmPermanentError(f"cannot start QEMU: {exc}") from exc
        except OSError as exc:
            raise VmTransientError(f"cannot start QEMU: {exc}") from exc
        await readable(loop, vm.spawn_fd)


def release(loop: asyncio.AbstractEventLoop, vm: Any) -> asyncio.Task[None]:
    """SIGKILL QEMU now; reap it, close its fds and remove its cgroup without blocking the
    loop. The task is tracked until done (wait_released)."""
    vm.kill()
    task = loop.create_task(_reap_and_close(loop, vm), name=f"release-qemu-{vm.pid}")
    _releasing.add(task)
    task.add_done_callback(_releasing.discard)
    return task


async def _reap_and_close(loop: asyncio.AbstractEventLoop, vm: Any) -> None:
    try:
        # The pidfd is readable once QEMU has exited (also once reaped); without one (Linux
        # < 5.3) the reap below waits for it in the thread instead. Not reaped here: reaping a
        # PID namespace's init flushes its /proc entries, milliseconds on a busy host.
        if vm.pidfd >= 0:
            await readable(loop, vm.pidfd)
    except BaseException:
        vm.close()  # cancelled (the loop is going away): finish here rather than leave QEMU
        raise
    # Reaps (at once: it has exited), closes the fds, reads the cgroup's figures and removes it.
    # Not on the loop: removing a cgroup retries while the kernel still holds it (cgroup.c).
    closing = loop.run_in_executor(None, vm.close)
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await asyncio.wait({closing})  # a thread cannot be stopped: let it finish first
        raise


async def wait_released() -> None:
    """Wait until every VM closed on this loop so far is reaped and its cgroup removed."""
    loop = asyncio.get_running_loop()
    while pending := [task for task in _releasing if task.get_loop() is loop]:
        await asyncio.wait(pending)
