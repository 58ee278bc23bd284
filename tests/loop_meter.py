"""How long code holds an asyncio loop, per loop callback (shared by
tests/integration/performance/test_loop_stalls.py and bench/loop_stall.py).

A callback that makes the loop late has three possible causes on a busy 2-core host:
- the loop thread's own work in it: its CPU time (`cpu`, from CLOCK_THREAD_CPUTIME_ID, user and
  kernel time both) is the part this process's code certainly caused;
- the loop thread off any CPU while it was runnable (8 emulated guests compete for 2 cores):
  read from /proc/thread-self/schedstat (run-queue wait) and taken out of `held`;
- the loop thread asleep inside the callback: a blocking syscall, or the GIL held by another
  thread of the process (an executor thread hashing a file). That is `held - cpu`: reported,
  never silently counted as ours or as the host's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class RunQueueClock:
    """Seconds the calling thread has waited on a run queue (for a CPU), from schedstat. Open it
    on the thread it measures (the loop's)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        self._last = 0.0

    def waited_s(self) -> float:
        """The last reading once closed: a callback wrapped while a meter was installed may
        still end after (the one closing it, for a start)."""
        if self._fd >= 0:
            self._last = int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        return self._last

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


@dataclass(frozen=True)
class Stall:
    """One loop callback that held the loop: held = wall - run-queue wait; cpu = the loop
    thread's own CPU time in it."""

    held_s: float
    wall_s: float
    cpu_s: float
    what: str

    def __str__(self) -> str:
        return (
            f"{self.held_s * 1000:7.1f} ms held ({self.wall_s * 1000:7.1f} wall, "
            f"{self.cpu_s * 1000:5.1f} cpu)  {self.what}"
        )


@dataclass
class CallbackMeter:
    """Wraps asyncio's Handle._run (every callback and task step of every loop): records each
    callback that held the loop longer than threshold_s, and a span for every callback."""

    clock: RunQueueClock
    threshold_s: float
    slow: list[Stall] = field(default_factory=list)
    # (start, end, held, what: for those over 0.5 ms) of every callback
    spans: list[tuple[float, float, float, str]] = field(default_factory=list)
    _orig: Callable[[Any], None] | None = None

    def install(self) -> None:
        orig = asyncio.events.Handle._run
        meter = self

        def _run(handle: Any) -> None:
            w0, q0, c0 = time.perf_counter(), meter.clock.waited_s(), time.thread_time()
            try:
                orig(handle)
            finally:
                wall = time.perf_counter() - w0
                held = wall - (meter.clock.waited_s() - q0)
                meter.spans.append((w0, w0 + wall, held, describe(handle) if held > 5e-4 else ""))
                if held > meter.threshold_s:
                    # One thread cannot run longer than the time that passed: a figure over
                    # the wall time is the clock's accounting (this host is itself a VM, whose
                    # CPU time is charged in ticks), and counts as the wall time.
                    cpu = min(time.thread_time() - c0, wall)
                    meter.slow.append(Stall(held, wall, cpu, describe(handle)))

        self._orig = orig
        asyncio.events.Handle._run = _run  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._orig is not None:
            asyncio.events.Handle._run = self._orig  # type: ignore[method-assign]
            self._orig = None

    def take(self) -> list[Stall]:
        """The slow callbacks so far, longest first; forgets them."""
        slow, self.slow = sorted(self.slow, key=lambda s: s.held_s, reverse=True), []
        self.spans.clear()
        return slow


def describe(handle: Any) -> str:
    callback = handle._callback
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        # Where the step ended: the innermost coroutine it awaits now.
        inner: Any = coro
        while getattr(inner, "cr_await", None) is not None and hasattr(inner.cr_await, "cr_frame"):
            inner = inner.cr_await
        frame = getattr(inner, "cr_frame", None)
        where = f" (now at {frame.f_code.co_name}:{frame.f_lineno})" if frame else ""
        return f"task step {getattr(coro, '__qualname__', coro)}{where}"
    return getattr(callback, "__qualname__", repr(callback))
