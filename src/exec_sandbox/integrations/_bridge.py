"""The shared background scheduler that the integrations' synchronous entry points use.

Frameworks call tools synchronously, often from inside their own running event loop (ADK does
this). Blocking that loop on a coroutine scheduled on the same loop would deadlock, so the shared
Scheduler lives on its own daemon thread with its own loop; a synchronous caller submits the
coroutine there and waits on a concurrent future. One such loop per process, created on first
use and closed at interpreter exit (killing every VM it still owns).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from exec_sandbox import SandboxScheduler, Scheduler, SchedulerConfig

_T = TypeVar("_T")


class BackgroundScheduler:
    """A Scheduler running on a private event loop in a daemon thread."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="exec-sandbox-bridge", daemon=True
        )
        self._thread.start()
        self._closed = False
        # Built on the loop thread so that everything it creates belongs to that loop.
        self.scheduler: SandboxScheduler = self._submit(self._make(config)).result()

    @staticmethod
    async def _make(config: SchedulerConfig | None) -> SandboxScheduler:
        return Scheduler(config)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run_sync(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run coro on the background loop and wait for it; callable from any thread, with or
        without a running loop of its own, except the background loop's thread itself."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("run_sync() called from the exec-sandbox background loop")
        if self._closed:
            coro.close()
            raise RuntimeError("the exec-sandbox background scheduler is closed")
        return self._submit(coro).result()

    async def run_async(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await coro on the background loop without blocking the caller's loop."""
        if self._closed:
            coro.close()
            raise RuntimeError("the exec-sandbox background scheduler is closed")
        return await asyncio.wrap_future(self._submit(coro))

    def close(self) -> None:
        """Kill every VM of the shared scheduler and stop the loop. Idempotent. First runs the
        finalizers registered with before_close() (pausing keyed sessions needs this loop)."""
        if self._closed:
            return
        while _before_close:
            ending = _before_close.pop()
            try:
                ending()  # a weakref.finalize: runs once, and a dead one does nothing
            except Exception:
                pass
        self._closed = True
        if self._loop.is_running():
            try:
                self._submit(self.scheduler.close()).result(timeout=30)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=30)
        if not self._loop.is_running():
            self._loop.close()


_shared: BackgroundScheduler | None = None
_shared_lock = threading.Lock()
# Finalizers to run before the shared scheduler closes (at exit included): the scheduler closes
# at exit before weakref.finalize's own exit hook runs, which would find it closed.
_before_close: list[weakref.finalize[Any, Any]] = []


def before_close(ending: weakref.finalize[Any, Any]) -> None:
    """Run `ending` (an object's finalizer) before the shared scheduler closes, if the object
    is still alive then: a keyed session is paused at exit, not killed with the scheduler."""
    _before_close[:] = [f for f in _before_close if f.alive]
    _before_close.append(ending)


def background() -> BackgroundScheduler:
    """The process-wide background scheduler, started on first use, closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = BackgroundScheduler()
            _at_exit(_shared.close)
        return _shared


def _at_exit(close: Callable[[], None]) -> None:
    """Run close at interpreter exit while executor threads still take work: closing (and
    pausing) sessions hands disk and process work to the loop's default executor, which
    concurrent.futures shuts down in threading's exit hooks, before atexit's. Those hooks run
    last-registered first, so one registered here runs before that shutdown. atexit stays as the
    fallback (close is idempotent)."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(close)
        except RuntimeError:
            pass  # the interpreter is already shutting down
    atexit.register(close)


class Runner:
    """Runs scheduler coroutines for an integration, sync or async.

    With `scheduler=None` everything runs on the shared background scheduler. With a caller's
    Scheduler, async calls run on the caller's loop, and sync calls are forwarded to the loop the
    scheduler was first used on when called from another thread (a sync call on that loop's own
    thread would deadlock, so it raises instead).
    """

    def __init__(self, scheduler: SandboxScheduler | None) -> None:
        self._own = scheduler
        self._loop: asyncio.AbstractEventLoop | None = _running_loop()

    @property
    def scheduler(self) -> SandboxScheduler:
        return self._own if self._own is not None else background().scheduler

    def run(self, make: Callable[[SandboxScheduler], Awaitable[_T]]) -> _T:
        if self._own is None:
            bridge = background()
            return bridge.run_sync(_call(make, bridge.scheduler))
        loop = self._loop
        if loop is None or not loop.is_running() or loop is _running_loop():
            raise RuntimeError(
                "this Scheduler runs on an event loop that is not running or is this thread's "
                "own loop, so a synchronous call cannot wait for it; use the async method, or "
                "pass scheduler=None to use the shared background scheduler"
            )
        return asyncio.run_coroutine_threadsafe(_call(make, self._own), loop).result()

    async def arun(self, make: Callable[[SandboxScheduler], Awaitable[_T]]) -> _T:
        if self._own is None:
            bridge = background()
            return await bridge.run_async(_call(make, bridge.scheduler))
        current = asyncio.get_running_loop()
        if self._loop is None or not self._loop.is_running():
            self._loop = current
        if self._loop is not current:
            return await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(_call(make, self._own), self._loop)
            )
        return await make(self._own)


async def _call(
    make: Callable[[SandboxScheduler], Awaitable[_T]], scheduler: SandboxScheduler
) -> _T:
    return await make(scheduler)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
