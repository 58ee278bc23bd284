"""The warm pool: per language, `warm_pool_size` VMs (one int for every language, or a mapping
language -> count) started ahead and warmed up, each handed to exactly one request and destroyed
after it.

Targets fit admission. Pooled VMs hold admission tickets, so a pool asked for more VMs than the
budget admits at once (VM count, guest RAM, vCPUs) could never fill: the targets are cut to what
fits, one VM per language in turn (python first), with a warning. `wait_ready()` returns once
every target is met, and raises instead of waiting for what cannot happen: the pool is closed,
or starting a language's VMs failed `GIVE_UP_AFTER_FAILURES` times in a row (the refill keeps
retrying in the background).

One refill task per language keeps its pool full. Refills are background work: they take an
admission ticket only while no foreground request waits, and they start one VM at a time across
all languages, so that on a 2-core host a refill never takes more than one core away from the
requests being served. Idle pooled VMs hold tickets; a foreground request that does not fit
makes admission reclaim (destroy) idle ones.

Only VMs of the scheduler's default configuration are pooled (default memory, no network, the
language's default packages if any); a request with any other configuration boots or restores
its own VM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from ..errors import PermanentError, SandboxError, VmPermanentError, VmTransientError
from ..models import LANGUAGES, Language
from ..vm.guest import GuestVm
from .admission import Admission, Budget
from .lease import Lease

log = logging.getLogger("exec_sandbox")

# After a failed refill, wait this long before the next attempt (doubling up to the maximum),
# so that a host that cannot start VMs is not hammered.
_RETRY_FIRST_SECONDS = 1.0
_RETRY_MAX_SECONDS = 30.0
# wait_ready() gives up on a language whose VMs failed to start this many times in a row.
GIVE_UP_AFTER_FAILURES = 3

PoolSize = int | Mapping[str, int]


def requested_sizes(size: PoolSize) -> dict[Language, int]:
    """`warm_pool_size` as a count per language (SchedulerConfig validated it)."""
    if isinstance(size, Mapping):
        return {lang: int(size.get(lang, 0)) for lang in LANGUAGES}
    return {lang: size for lang in LANGUAGES}


def fit_sizes(
    requested: Mapping[Language, int], memory_mb: int, vcpus: int, budget: Budget
) -> dict[Language, int]:
    """The targets cut to the VMs of memory_mb / vcpus that the budget admits at once: one VM
    per language in turn (LANGUAGES order), each up to its request."""
    capacity = min(
        budget.max_vms, budget.memory_mb // max(memory_mb, 1), budget.vcpus // max(vcpus, 1)
    )
    fitted = {lang: 0 for lang in LANGUAGES}
    left = max(0, capacity)
    while left > 0:
        grew = False
        for lang in LANGUAGES:
            if left > 0 and fitted[lang] < requested.get(lang, 0):
                fitted[lang] += 1
                left -= 1
                grew = True
        if not grew:
            break
    return fitted


@dataclass
class PooledVm:
    lease: Lease[GuestVm]  # the VM and its admission ticket
    language: Language
    # How the VM was started: a restored one came from an L1 snapshot.
    restored: bool
    # time.monotonic() when the guest last answered (it joined the pool right after its PRESTART).
    checked_at: float = field(default_factory=time.monotonic)

    @property
    def vm(self) -> GuestVm:
        return self.lease.vm


# Starts one VM for the pool (provisioning.Provisioner.start_pool_vm: restore or boot, then warm
# up) and says whether it was restored; the pool owns the result.
VmFactory = Callable[[Language], Awaitable[tuple[GuestVm, bool]]]


class WarmPool:
    def __init__(
        self,
        size: PoolSize,
        memory_mb: int,
        vcpus: int,
        admission: Admission,
        factory: VmFactory,
        wait_quiet: Callable[[], Awaitable[None]],
    ) -> None:
        self.requested = requested_sizes(size)
        # What the pool keeps per language: the request, cut to what admission admits at once.
        self.sizes = fit_sizes(self.requested, memory_mb, vcpus, admission.budget)
        if self.sizes != self.requested:
            budget = admission.budget
            log.warning(
                "warm pool: warm_pool_size asks for %d VMs of %d MB (%s), but admission admits "
                "at most %d at once (max_concurrent_vms=%d, guest RAM %d MB, %d vCPUs): "
                "pooling %s instead",
                sum(self.requested.values()),
                memory_mb,
                _show(self.requested),
                sum(self.sizes.values()),
                budget.max_vms,
                budget.memory_mb,
                budget.vcpus,
                _show(self.sizes),
            )
        self._wait_quiet = wait_quiet
        self.memory_mb = memory_mb
        self.vcpus = vcpus
        self._admission = admission
        self._factory = factory
        self._idle: dict[Language, deque[PooledVm]] = {lang: deque() for lang in LANGUAGES}
        self._tasks: dict[Language, asyncio.Task[None]] = {}
        # Per language: failed starts in a row, and the last error (wait_ready gives up on them).
        self._failures: dict[Language, int] = {lang: 0 for lang in LANGUAGES}
        self._last_error: dict[Language, BaseException | None] = {lang: None for lang in LANGUAGES}
        self._changed = asyncio.Event()
        self._refill_slot = asyncio.Semaphore(1)
        self._closed = False

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def start(self) -> None:
        if self.total <= 0 or self._tasks or self._closed:
            return
        for lang in LANGUAGES:
            if self.sizes[lang] > 0:
                self._tasks[lang] = asyncio.create_task(
                    self._refill(lang), name=f"warm-pool-{lang}"
                )

    def matches(self, memory_mb: int, allow_network: bool) -> bool:
        """Whether a request of this configuration can be served from the pool."""
        return self.total > 0 and memory_mb == self.memory_mb and not allow_network

    def take(self, language: Language) -> PooledVm | None:
        """An idle, live VM for language (the caller owns it and its ticket), or None."""
        idle = self._idle[language]
        while idle:
            pooled = idle.popleft()
            self._changed.set()
            if pooled.vm.alive:
                return pooled
            log.warning("pooled %s VM died while idle: discarding it", language)
            pooled.lease.discard()
        return None

    def reclaim_one(self) -> bool:
        """Destroy one idle VM (of the language with the most idle VMs) to free its ticket for
        a waiting foreground request. False if the pool has none."""
        lang = max(LANGUAGES, key=lambda lg: len(self._idle[lg]))
        if not self._idle[lang]:
            return False
        self._idle[lang].pop().lease.discard()
        self._changed.set()
        return True

    @property
    def idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def idle_by_language(self) -> dict[Language, int]:
        """Idle VMs per language now (the warm-pool stock a placement decision looks at)."""
        return {lang: len(self._idle[lang]) for lang in LANGUAGES}

    def is_full(self) -> bool:
        return all(len(self._idle[lang]) >= self.sizes[lang] for lang in LANGUAGES)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every language has its target of idle VMs (`sizes`). Raises SandboxError
        when that cannot happen (see the module's docstring), asyncio.TimeoutError after
        `timeout` seconds."""

        async def full() -> None:
            while not self.is_full():
                self._raise_if_cannot_fill()
                self._changed.clear()
                await self._changed.wait()

        if self.total <= 0:
            return
        await asyncio.wait_for(full(), timeout)

    def _raise_if_cannot_fill(self) -> None:
        if self._closed:
            raise SandboxError("the warm pool is closed")
        if not self._tasks:
            raise SandboxError("the warm pool was never started")
        for lang in LANGUAGES:
            if len(self._idle[lang]) >= self.sizes[lang]:
                continue
            failures, error = self._failures[lang], self._last_error[lang]
            if failures >= GIVE_UP_AFTER_FAILURES:
                kind = VmPermanentError if isinstance(error, PermanentError) else VmTransientError
                raise kind(
                    f"warm pool: starting a {lang} VM failed {failures} times in a row "
                    f"(last: {error}); the pool keeps retrying"
                ) from error
            task = self._tasks[lang]
            if task.done():  # a refill must run until close(): one that ended cannot fill
                raise SandboxError(f"warm pool: the {lang} refill ended unexpectedly") from (
                    None if task.cancelled() else task.exception()
                )

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for idle in self._idle.values():
            while idle:
                idle.popleft().lease.discard()
        self._changed.set()

    async def _refill(self, language: Language) -> None:
        retry = _RETRY_FIRST_SECONDS
        idle = self._idle[language]
        while not self._closed:
            if len(idle) >= self.sizes[language]:
                self._changed.clear()
                await self._changed.wait()
                continue
            async with self._refill_slot:
                await self._wait_quiet()
                ticket = await self._admission.acquire(self.memory_mb, self.vcpus, background=True)
                restored = False

                async def start() -> GuestVm:
                    nonlocal restored
                    vm, restored = await self._factory(language)
                    return vm

                try:
                    lease = await Lease.acquire(ticket, start)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._failures[language] += 1
                    self._last_error[language] = exc
                    self._changed.set()  # wait_ready() decides whether to give up
                    log.warning(
                        "warm pool: starting a %s VM failed (%s); retrying in %.0f s",
                        language,
                        exc,
                        retry,
                    )
                    await asyncio.sleep(retry)
                    retry = min(retry * 2, _RETRY_MAX_SECONDS)
                    continue
            retry = _RETRY_FIRST_SECONDS
            self._failures[language] = 0
            self._last_error[language] = None
            if self._closed:
                lease.discard()
                return
            idle.append(PooledVm(lease, language, restored))
            self._changed.set()


def _show(sizes: Mapping[Language, int]) -> str:
    return ", ".join(f"{lang} {n}" for lang, n in sizes.items())
