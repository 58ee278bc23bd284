"""The warm pool: VMs started ahead and warmed up, each handed to exactly one request and
destroyed after it. `warm_pool_size` says how many per pool: one int for every language of the
default image, or a mapping whose keys are a language of the default image ("python") or a
language of a template ("go-dev:raw"). A pool is a `PoolKey`; its idle VMs and its refill task
are kept by it.

What a pooled VM serves. Each remembers the `PoolShape` it was started with: guest RAM, vCPUs
and, for a template, the template's digest. A request takes one only when its language, template
digest, RAM and vCPUs are those, and it has no network (scheduler.py; for the default image, also
the language's default packages). A template's VMs get the template's `memory_mb` / `vcpus`
defaults (else the scheduler's), as a call of the template that gives none does
(RunRequest.with_defaults): such calls are the ones its pool serves. A pooled VM of another
digest than the template's now (the template was rebuilt) is discarded when a request finds it,
never served; one whose template this scheduler rebuilt or deleted is discarded at once
(`template_changed`).

Template pools resolve their template by name through the template store each time they start a
VM. While it does not exist (or lacks the pool's language), that pool's refill looks again with
backoff (1 s doubling to 30 s, at once when this scheduler builds it), logging once; the other
pools fill as usual.

Targets fit admission. Pooled VMs hold admission tickets, so a pool asked for more VMs than the
budget admits at once (VM count, guest RAM, vCPUs) could never fill: when the pool starts, the
targets are cut to what fits, one VM per pool in turn (the default image's languages, python
first, then the templates' pools in the order given), each VM counted with its pool's RAM and
vCPUs (a template's defaults as the store has them then; the scheduler's for one not built yet),
with a warning.

`wait_ready()` returns once every pool has its target, except template pools whose template was
missing (or lacked the language) when their refill last looked: it does not wait for a template
that may never be built. It raises instead of waiting for what cannot happen: the pool is closed,
or starting a pool's VMs failed `GIVE_UP_AFTER_FAILURES` times in a row (the refill keeps
retrying in the background).

Refills are background work: they take an admission ticket only while no foreground request
waits, and they start one VM at a time across all pools, so that on a 2-core host a refill never
takes more than one core away from the requests being served. Idle pooled VMs hold tickets; a
foreground request that does not fit makes admission reclaim (destroy) idle ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from ..errors import PermanentError, SandboxError, VmPermanentError, VmTransientError
from ..models import LANGUAGES, Language, Template
from ..vm.guest import GuestVm
from .admission import Admission, Budget
from .lease import Lease

log = logging.getLogger("exec_sandbox")

# After a failed refill, or one that found no template, wait this long before the next attempt
# (doubling up to the maximum), so that a host that cannot start VMs is not hammered.
_RETRY_FIRST_SECONDS = 1.0
_RETRY_MAX_SECONDS = 30.0
# wait_ready() gives up on a pool whose VMs failed to start this many times in a row.
GIVE_UP_AFTER_FAILURES = 3

PoolSize = int | Mapping[str, int]


@dataclass(frozen=True)
class PoolKey:
    """One pool: a language of the default image (template None) or of the template so named."""

    language: Language
    template: str | None = None

    @classmethod
    def parse(cls, key: str) -> PoolKey:
        """A `warm_pool_size` key, "LANGUAGE" or "TEMPLATE:LANGUAGE" (SchedulerConfig checked it;
        template names have no ':')."""
        template, colon, language = key.rpartition(":")
        return cls(language, template if colon else None)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.language if self.template is None else f"{self.template}:{self.language}"


@dataclass(frozen=True)
class PoolShape:
    """What a pool's VMs are started as: guest RAM, vCPUs, and the template (None: the default
    image). A pooled VM keeps the shape it was started with."""

    memory_mb: int
    vcpus: int
    template: Template | None = None

    @property
    def digest(self) -> str | None:
        return None if self.template is None else self.template.digest


def requested_sizes(size: PoolSize) -> dict[PoolKey, int]:
    """`warm_pool_size` as a count per pool (SchedulerConfig validated it): every language of
    the default image (LANGUAGES order), then the templates' pools in the order given."""
    if not isinstance(size, Mapping):
        return {PoolKey(lang): size for lang in LANGUAGES}
    sizes = {PoolKey(lang): int(size.get(lang, 0)) for lang in LANGUAGES}
    for name, count in size.items():
        key = PoolKey.parse(name)
        if key.template is not None:
            sizes[key] = int(count)
    return sizes


def fit_sizes(
    requested: Mapping[PoolKey, int], shapes: Mapping[PoolKey, PoolShape], budget: Budget
) -> dict[PoolKey, int]:
    """The targets cut to what the budget admits at once: one VM per pool in turn (requested's
    order), each up to its request and while the budget has room for one VM of its shape."""
    fitted = {key: 0 for key in requested}
    vms, memory, vcpus = budget.max_vms, budget.memory_mb, budget.vcpus
    grew = True
    while grew:
        grew = False
        for key, wanted in requested.items():
            shape = shapes[key]
            if (
                fitted[key] < wanted
                and vms >= 1
                and memory >= shape.memory_mb
                and vcpus >= shape.vcpus
            ):
                fitted[key] += 1
                vms, memory, vcpus = vms - 1, memory - shape.memory_mb, vcpus - shape.vcpus
                grew = True
    return fitted


@dataclass
class PooledVm:
    lease: Lease[GuestVm]  # the VM and its admission ticket
    key: PoolKey
    shape: PoolShape  # what it was started as (the template's digest among it)
    # How the VM was started: a restored one came from an L1 snapshot.
    restored: bool
    # time.monotonic() when the guest last answered (it joined the pool right after its PRESTART).
    checked_at: float = field(default_factory=time.monotonic)

    @property
    def vm(self) -> GuestVm:
        return self.lease.vm

    @property
    def language(self) -> Language:
        return self.key.language


# Starts one VM of a language and shape for the pool (provisioning.Provisioner.start_pool_vm:
# restore or boot, then warm up) and says whether it was restored; the pool owns the result.
VmFactory = Callable[[Language, PoolShape], Awaitable[tuple[GuestVm, bool]]]
# The template of a name now, or None (TemplateStore.get).
TemplateLookup = Callable[[str], Awaitable[Template | None]]


class WarmPool:
    def __init__(
        self,
        size: PoolSize,
        memory_mb: int,
        vcpus: int,
        admission: Admission,
        factory: VmFactory,
        wait_quiet: Callable[[], Awaitable[None]],
        templates: TemplateLookup | None = None,
    ) -> None:
        """memory_mb, vcpus: the default image's VMs (and a template's without defaults of its
        own). templates: where template pools find their template (None: they never do)."""
        self.requested = requested_sizes(size)
        # What the pool keeps per pool: the request, cut to what admission admits at once
        # (decided by start(), which may look templates up; nothing before).
        self.sizes = {key: 0 for key in self.requested}
        self._default = PoolShape(memory_mb, vcpus)
        self._wait_quiet = wait_quiet
        self._admission = admission
        self._factory = factory
        self._templates = templates
        self._idle: dict[PoolKey, deque[PooledVm]] = {key: deque() for key in self.requested}
        self._starting: asyncio.Task[None] | None = None
        self._tasks: dict[PoolKey, asyncio.Task[None]] = {}
        # Per pool: failed starts in a row, and the last error (wait_ready gives up on them).
        self._failures: dict[PoolKey, int] = {key: 0 for key in self.requested}
        self._last_error: dict[PoolKey, BaseException | None] = {
            key: None for key in self.requested
        }
        # Template pools whose template was missing (or lacked the language) when last looked.
        self._missing: set[PoolKey] = set()
        # Set to end a refill's backoff early (its template was built here, or the pool closes).
        self._wake: dict[PoolKey, asyncio.Event] = {key: asyncio.Event() for key in self.requested}
        self._changed = asyncio.Event()
        self._refill_slot = asyncio.Semaphore(1)
        self._closed = False

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def start(self) -> None:
        """Start filling in the background: first the targets (looking the templates of template
        pools up for their RAM and vCPUs), then one refill task per pool."""
        if self._starting is not None or self._closed or sum(self.requested.values()) <= 0:
            return
        self._starting = asyncio.create_task(self._start(), name="warm-pool-start")

    async def _start(self) -> None:
        shapes: dict[PoolKey, PoolShape] = {}
        for key, wanted in self.requested.items():
            shape: PoolShape | None = self._default
            if key.template is not None and wanted > 0:
                shape = await self._shape(key)
                if shape is None:
                    self._note_missing(key)
            shapes[key] = shape or self._default
        self.sizes = fit_sizes(self.requested, shapes, self._admission.budget)
        if self.sizes != self.requested:
            budget = self._admission.budget
            log.warning(
                "warm pool: warm_pool_size asks for %d VMs (%s), but admission admits at most "
                "%d of them at once (max_concurrent_vms=%d, guest RAM %d MB, %d vCPUs): "
                "pooling %s instead",
                sum(self.requested.values()),
                _show(self.requested, shapes),
                sum(self.sizes.values()),
                budget.max_vms,
                budget.memory_mb,
                budget.vcpus,
                _show(self.sizes),
            )
        if self._closed:
            return
        for key, target in self.sizes.items():
            if target > 0:
                self._tasks[key] = asyncio.create_task(self._refill(key), name=f"warm-pool-{key}")
        self._changed.set()

    def take(self, key: PoolKey, memory_mb: int, vcpus: int, digest: str | None) -> PooledVm | None:
        """An idle, live VM of pool key started with this RAM, these vCPUs and this template
        digest (None: the default image), or None; the caller owns it and its ticket. Dead VMs
        and VMs of another digest (their template was rebuilt) found on the way are discarded."""
        idle = self._idle.get(key)
        if not idle:
            return None
        found = None
        for pooled in list(idle):
            if not pooled.vm.alive:
                log.warning("pooled %s VM died while idle: discarding it", key)
                pooled.lease.discard()
            elif pooled.shape.digest != digest:
                log.info("pooled %s VM is of an older build of its template: discarding it", key)
                pooled.lease.discard()
            elif (
                found is None
                and pooled.shape.memory_mb == memory_mb
                and pooled.shape.vcpus == vcpus
            ):
                found = pooled
            else:
                continue
            idle.remove(pooled)
            self._changed.set()  # its refill starts a replacement
        return found

    def template_changed(self, name: str, template: Template | None) -> None:
        """This scheduler built (template) or deleted (None) the template name: its pools'
        idle VMs of another shape are discarded, and their refills look it up now."""
        for key, idle in self._idle.items():
            if key.template != name:
                continue
            shape = None if template is None else self._shape_of(key, template)
            for pooled in list(idle):
                if pooled.shape != shape:
                    idle.remove(pooled)
                    pooled.lease.discard()
            self._wake[key].set()
            self._changed.set()

    def reclaim_one(self) -> bool:
        """Destroy one idle VM (of the pool with the most idle VMs) to free its ticket for a
        waiting foreground request. False if the pool has none."""
        key = max(self._idle, key=lambda k: len(self._idle[k]))
        if not self._idle[key]:
            return False
        self._idle[key].pop().lease.discard()
        self._changed.set()
        return True

    @property
    def idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def idle_by_key(self) -> dict[PoolKey, int]:
        """Idle VMs per pool now (the warm-pool stock a placement decision looks at): every
        language of the default image, then the templates' pools."""
        return {key: len(idle) for key, idle in self._idle.items()}

    def is_ready(self) -> bool:
        """Every pool holds its target, but for template pools waiting for their template."""
        return all(
            len(self._idle[key]) >= target or key in self._missing
            for key, target in self.sizes.items()
        )

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every pool has its target of idle VMs (`sizes`), template pools whose
        template is missing (or lacks the language) apart: those are not waited for, and fill
        in the background once it is built. Raises SandboxError when the rest cannot fill (see
        the module's docstring), asyncio.TimeoutError after `timeout` seconds."""

        async def ready() -> None:
            if self._starting is None:
                if self._closed:
                    raise SandboxError("the warm pool is closed")
                raise SandboxError("the warm pool was never started")
            # The targets first (asyncio.wait: never raises for the task, nor cancels it).
            await asyncio.wait({self._starting})
            while not self.is_ready():
                self._raise_if_cannot_fill()
                self._changed.clear()
                await self._changed.wait()

        if sum(self.requested.values()) <= 0:
            return
        await asyncio.wait_for(ready(), timeout)

    def _raise_if_cannot_fill(self) -> None:
        if self._closed:
            raise SandboxError("the warm pool is closed")
        assert self._starting is not None and self._starting.done()
        if not self._starting.cancelled() and self._starting.exception() is not None:
            raise SandboxError("the warm pool failed to start") from self._starting.exception()
        for key, target in self.sizes.items():
            if len(self._idle[key]) >= target or key in self._missing:
                continue
            failures, error = self._failures[key], self._last_error[key]
            if failures >= GIVE_UP_AFTER_FAILURES:
                kind = VmPermanentError if isinstance(error, PermanentError) else VmTransientError
                raise kind(
                    f"warm pool: starting a {key} VM failed {failures} times in a row "
                    f"(last: {error}); the pool keeps retrying"
                ) from error
            task = self._tasks[key]
            if task.done():  # a refill must run until close(): one that ended cannot fill
                raise SandboxError(f"warm pool: the {key} refill ended unexpectedly") from (
                    None if task.cancelled() else task.exception()
                )

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        if self._starting is not None:
            tasks.append(self._starting)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for idle in self._idle.values():
            while idle:
                idle.popleft().lease.discard()
        self._changed.set()

    # --- refills ---

    def _shape_of(self, key: PoolKey, template: Template) -> PoolShape | None:
        """The shape of key's VMs for template (its defaults, else the pool's), or None when it
        lacks key's language."""
        if key.language not in template.languages:
            return None
        return PoolShape(
            template.memory_mb or self._default.memory_mb,
            template.vcpus or self._default.vcpus,
            template,
        )

    async def _shape(self, key: PoolKey) -> PoolShape | None:
        """What key's next VM is started as: its template as the store has it now (None: there
        is none of that name, or it lacks the language)."""
        if key.template is None:
            return self._default
        if self._templates is None:
            return None
        try:
            template = await self._templates(key.template)
        except Exception as exc:  # a store that cannot be read: like a missing template
            log.warning("warm pool: looking up template %r failed (%s)", key.template, exc)
            return None
        return None if template is None else self._shape_of(key, template)

    def _note_missing(self, key: PoolKey) -> None:
        if key not in self._missing:
            log.warning(
                "warm pool: no template %r with %s yet: its %s pool fills once it is built",
                key.template,
                key.language,
                key,
            )
            self._missing.add(key)
        self._changed.set()  # wait_ready() stops waiting for it

    async def _pause(self, key: PoolKey, seconds: float) -> None:
        """Sleep before the next attempt; template_changed() or close() end it early."""
        try:
            await asyncio.wait_for(self._wake[key].wait(), seconds)
        except TimeoutError:
            pass

    async def _refill(self, key: PoolKey) -> None:
        retry = _RETRY_FIRST_SECONDS
        idle = self._idle[key]
        while not self._closed:
            if len(idle) >= self.sizes[key]:
                self._changed.clear()
                await self._changed.wait()
                continue
            self._wake[key].clear()  # a template_changed() from now on cuts the pause short
            shape = await self._shape(key)
            if shape is None:
                self._note_missing(key)
                await self._pause(key, retry)
                retry = min(retry * 2, _RETRY_MAX_SECONDS)
                continue
            if key in self._missing:
                log.info("warm pool: template %r is there: filling its %s pool", key.template, key)
                self._missing.discard(key)
                retry = _RETRY_FIRST_SECONDS
            lease, restored, error = await self._start_one(key, shape)
            if lease is None:
                self._failures[key] += 1
                self._last_error[key] = error
                self._changed.set()  # wait_ready() decides whether to give up
                log.warning(
                    "warm pool: starting a %s VM failed (%s); retrying in %.0f s", key, error, retry
                )
                await self._pause(key, retry)
                retry = min(retry * 2, _RETRY_MAX_SECONDS)
                continue
            retry = _RETRY_FIRST_SECONDS
            self._failures[key] = 0
            self._last_error[key] = None
            if self._closed:
                lease.discard()
                return
            idle.append(PooledVm(lease, key, shape, restored))
            self._changed.set()

    async def _start_one(
        self, key: PoolKey, shape: PoolShape
    ) -> tuple[Lease[GuestVm] | None, bool, Exception | None]:
        """One VM of shape with its ticket (one start at a time across all pools), or the
        error that kept it from starting."""
        restored = False

        async def start() -> GuestVm:
            nonlocal restored
            vm, restored = await self._factory(key.language, shape)
            return vm

        async with self._refill_slot:
            await self._wait_quiet()
            try:
                ticket = await self._admission.acquire(
                    shape.memory_mb, shape.vcpus, background=True
                )
                return await Lease.acquire(ticket, start), restored, None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return None, False, exc


def _show(sizes: Mapping[PoolKey, int], shapes: Mapping[PoolKey, PoolShape] | None = None) -> str:
    def one(key: PoolKey) -> str:
        shape = "" if shapes is None else f" of {shapes[key].memory_mb} MB"
        return f"{key} {sizes[key]}{shape}"

    return ", ".join(one(key) for key in sizes if sizes[key] or key.template is None)
