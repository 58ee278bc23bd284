"""The warm pool: per language, `warm_pool_size` VMs started ahead and warmed up, each handed to
exactly one request and destroyed after it.

One refill task per language keeps its pool full. Refills are background work: they take an
admission ticket only while no foreground request waits, and they start one VM at a time across
all languages, so that on a 2-core host a refill never takes more than one core away from the
requests being served. Idle pooled VMs hold tickets; a foreground request that does not fit
makes admission reclaim (destroy) idle ones.

Only VMs of the scheduler's default configuration are pooled (default memory, no network); a
request with any other configuration boots or restores its own VM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._vm import GuestVm
from .admission import Admission, Ticket
from .models import LANGUAGES, Language

log = logging.getLogger("exec_sandbox")

# After a failed refill, wait this long before the next attempt (doubling up to the maximum),
# so that a host that cannot start VMs is not hammered.
_RETRY_FIRST_SECONDS = 1.0
_RETRY_MAX_SECONDS = 30.0


@dataclass
class PooledVm:
    vm: GuestVm
    ticket: Ticket
    language: Language
    # How the VM was started: a restored one came from an L1 snapshot.
    restored: bool
    # time.monotonic() when the guest last answered (it joined the pool right after its PRESTART).
    checked_at: float = field(default_factory=time.monotonic)


# Starts one VM for the pool (restore or boot, then warm up); the pool owns the result.
VmFactory = Callable[[Language], Awaitable[tuple[GuestVm, bool]]]


class WarmPool:
    def __init__(self, size: int, memory_mb: int, vcpus: int, admission: Admission,
                 factory: VmFactory, wait_quiet: Callable[[], Awaitable[None]]) -> None:  # fmt: skip
        self.size = size
        self._wait_quiet = wait_quiet
        self.memory_mb = memory_mb
        self.vcpus = vcpus
        self._admission = admission
        self._factory = factory
        self._idle: dict[Language, deque[PooledVm]] = {lang: deque() for lang in LANGUAGES}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._refill_slot = asyncio.Semaphore(1)
        self._closed = False

    def start(self) -> None:
        if self.size <= 0 or self._tasks:
            return
        for lang in LANGUAGES:
            self._tasks.append(asyncio.create_task(self._refill(lang), name=f"warm-pool-{lang}"))

    def matches(self, memory_mb: int, allow_network: bool) -> bool:
        """Whether a request of this configuration can be served from the pool."""
        return self.size > 0 and memory_mb == self.memory_mb and not allow_network

    def take(self, language: Language) -> PooledVm | None:
        """An idle, live VM for language (the caller owns it and its ticket), or None."""
        idle = self._idle[language]
        while idle:
            pooled = idle.popleft()
            self._changed.set()
            if pooled.vm.alive:
                return pooled
            log.warning("pooled %s VM died while idle: discarding it", language)
            _destroy(pooled)
        return None

    def reclaim_one(self) -> bool:
        """Destroy one idle VM (of the language with the most idle VMs) to free its ticket for
        a waiting foreground request. False if the pool has none."""
        lang = max(LANGUAGES, key=lambda lg: len(self._idle[lg]))
        if not self._idle[lang]:
            return False
        _destroy(self._idle[lang].pop())
        self._changed.set()
        return True

    @property
    def idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def is_full(self) -> bool:
        return all(len(self._idle[lang]) >= self.size for lang in LANGUAGES)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every language has `size` idle VMs."""

        async def full() -> None:
            while not self.is_full():
                if self._closed:
                    raise RuntimeError("the warm pool is closed")
                self._changed.clear()
                await self._changed.wait()

        if self.size <= 0:
            return
        await asyncio.wait_for(full(), timeout)

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for idle in self._idle.values():
            while idle:
                _destroy(idle.popleft())
        self._changed.set()

    async def _refill(self, language: Language) -> None:
        retry = _RETRY_FIRST_SECONDS
        idle = self._idle[language]
        while not self._closed:
            if len(idle) >= self.size:
                self._changed.clear()
                await self._changed.wait()
                continue
            async with self._refill_slot:
                await self._wait_quiet()
                ticket = await self._admission.acquire(self.memory_mb, self.vcpus,
                                                       background=True)  # fmt: skip
                try:
                    vm, restored = await self._factory(language)
                except asyncio.CancelledError:
                    ticket.release()
                    raise
                except Exception as exc:
                    ticket.release()
                    log.warning("warm pool: starting a %s VM failed (%s); retrying in %.0f s",
                                language, exc, retry)  # fmt: skip
                    await asyncio.sleep(retry)
                    retry = min(retry * 2, _RETRY_MAX_SECONDS)
                    continue
            retry = _RETRY_FIRST_SECONDS
            if self._closed:
                vm.close()
                ticket.release()
                return
            idle.append(PooledVm(vm, ticket, language, restored))
            self._changed.set()


def _destroy(pooled: PooledVm) -> None:
    pooled.vm.close()
    pooled.ticket.release()
