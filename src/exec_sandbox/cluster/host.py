"""The host actor: one per node of the cluster, owning an ordinary Scheduler and the sessions
opened on it (docs/scaling.md).

Everything that makes one host fast or safe stays here, unchanged: admission, the warm pool,
L1 snapshot clones, the jail. The actor adds a registry of its sessions by id and a wire
format. Errors of the library are returned as values, `("err", exception)`, never raised: the
client then tells them apart from failures of Ray itself (a dead host), which are the only
exceptions a call to this actor raises. Methods that run code are async generators (Ray's
streaming generators): they yield `("started", None)` before the call reaches the Scheduler,
the output as it comes (`("stdout" | "stderr" | "boot", text)`) when the client asked for it,
then the outcome.

This module does not import Ray: the client creates the actor from this plain class (_ray.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict
from typing import Any, TypeVar

from ..config import SchedulerConfig
from ..errors import SandboxError, SessionClosedError, VmCapacityError
from ..models import ExecutionResult, FileInfo, PackagesReport, SessionSnapshot
from ..run_request import Callbacks, RunRequest
from ..scheduler import Scheduler
from ..session import Session

log = logging.getLogger("exec_sandbox")
_T = TypeVar("_T")
Outcome = tuple[str, Any]  # ("ok", value) | ("err", SandboxError)
# Session ids seen by clients: "<host actor name>/<the host's session id>".
SEPARATOR = "/"


class SandboxHost:
    """The per-node actor. `config` holds only the SchedulerConfig fields the creating client
    set (client.py): paths and the derived max_concurrent_vms default to this host's own."""

    def __init__(self, name: str, config: Mapping[str, Any]) -> None:
        self.name = name
        self._config_fields = dict(config)
        self._scheduler: Scheduler | None = None
        self._sessions: dict[str, Session] = {}
        self._runs = 0
        self._started_at = time.time()

    # --- host state ---

    async def _ready(self) -> Scheduler:
        if self._scheduler is None:
            self._scheduler = Scheduler(SchedulerConfig(**self._config_fields))
        await self._scheduler.start()
        return self._scheduler

    async def info(self) -> Outcome:
        """Capacity, warm-pool stock and identity of this host (placement reads it)."""
        return await _guard(self._info)

    async def _info(self) -> dict[str, Any]:
        scheduler = await self._ready()
        self._prune()
        return {
            "name": self.name,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "accelerator": scheduler.accelerator,
            "capacity": asdict(scheduler.capacity()),
            "sessions": len(self._sessions),
            "runs": self._runs,
            "uptime_seconds": round(time.time() - self._started_at, 1),
        }

    async def doctor(self) -> Outcome:
        """`sbx doctor` of this host (its accelerator, QEMU, images, jail layers) and its info."""

        async def run() -> dict[str, Any]:
            from ..cli import doctor

            checks = await asyncio.get_running_loop().run_in_executor(None, doctor.run_checks)
            return {
                "info": await self._info(),
                "checks": doctor.as_dicts(checks),
                "healthy": doctor.healthy(checks),
            }

        return await _guard(run)

    async def shutdown(self) -> Outcome:
        """Close the Scheduler: every VM of this host ends (its sessions with it)."""

        async def run() -> None:
            self._sessions.clear()
            if self._scheduler is not None:
                await self._scheduler.close()

        return await _guard(run)

    # --- run() and sessions ---

    async def run(
        self, request: RunRequest, streams: tuple[str, ...], try_now: bool
    ) -> AsyncIterator[Outcome]:
        """Scheduler.run() of a request validated by the client. `try_now`: refuse at once
        (VmCapacityError) when admission would have to wait, so that the client tries the next
        host first."""

        async def call(callbacks: Callbacks) -> ExecutionResult:
            scheduler = await self._ready()
            self._check_room(scheduler, request.language, try_now)
            self._runs += 1
            return await scheduler.run_request(request, callbacks)

        async for item in _streamed(call, streams):
            yield item

    async def open_session(
        self, request: RunRequest, streams: tuple[str, ...], try_now: bool
    ) -> AsyncIterator[Outcome]:
        """Scheduler.session() of a request validated by the client, its boot log streamed
        when asked ("boot"). The session's default on_stdout/on_stderr stay with the client
        (each exec streams what it asks for)."""

        async def call(callbacks: Callbacks) -> dict[str, Any]:
            scheduler = await self._ready()
            self._check_room(scheduler, request.language, try_now)
            return self._register(await scheduler.session_request(request, callbacks))

        async for item in _streamed(call, streams):
            yield item

    async def resume(self, snapshot_id: str, try_now: bool) -> Outcome:
        """Scheduler.resume() here: SnapshotError when this host cannot reach the snapshot."""

        async def call() -> dict[str, Any]:
            scheduler = await self._ready()
            if try_now and not scheduler.capacity().has_room("python"):
                raise VmCapacityError(f"host {self.name} has no free VM slot now")
            return self._register(await scheduler.resume(snapshot_id))

        return await _guard(call)

    async def snapshots(self) -> Outcome:
        async def call() -> list[SessionSnapshot]:
            return await (await self._ready()).snapshots()

        return await _guard(call)

    async def delete_snapshot(self, snapshot_id: str) -> Outcome:
        async def call() -> bool:
            return await (await self._ready()).delete_snapshot(snapshot_id)

        return await _guard(call)

    async def session_info(self, session_id: str) -> Outcome:
        return await _guard(self._async(lambda: self._describe(self._session(session_id))))

    async def exec(
        self, session_id: str, code: str, options: dict[str, Any], streams: tuple[str, ...]
    ) -> AsyncIterator[Outcome]:
        async def call(callbacks: Callbacks) -> tuple[ExecutionResult, int]:
            session = self._session(session_id)
            result = await session.exec(
                code, **options, on_stdout=callbacks.on_stdout, on_stderr=callbacks.on_stderr
            )
            return result, session.exec_count

        async for item in _streamed(call, streams):
            yield item

    async def write_file(
        self, session_id: str, path: str, content: bytes, make_executable: bool
    ) -> Outcome:
        """`content` arrives through the object store (the client passes an ObjectRef)."""

        async def call() -> None:
            await self._session(session_id).write_file(
                path, content, make_executable=make_executable
            )

        return await _guard(call)

    async def read_file(self, session_id: str, path: str) -> Outcome:
        """The file's bytes as [ObjectRef]: put into the object store here, fetched from it by
        the client (a list, so that Ray hands the reference over instead of the bytes)."""
        from . import _ray

        async def call() -> list[Any]:
            data = await self._session(session_id).read_file(path)
            assert data is not None
            return [_ray.put(data)]

        return await _guard(call)

    async def list_files(self, session_id: str, path: str) -> Outcome:
        async def call() -> list[FileInfo]:
            return await self._session(session_id).list_files(path)

        return await _guard(call)

    async def install(
        self, session_id: str, packages: list[str], timeout_seconds: float | None
    ) -> Outcome:
        async def call() -> PackagesReport:
            return await self._session(session_id).install(
                packages, timeout_seconds=timeout_seconds
            )

        return await _guard(call)

    async def pause(self, session_id: str) -> Outcome:
        async def call() -> SessionSnapshot:
            session = self._session(session_id)
            try:
                return await session.pause()
            finally:
                self._prune()

        return await _guard(call)

    async def fork(self, session_id: str, count: int) -> Outcome:
        async def call() -> list[dict[str, Any]]:
            forks = await self._session(session_id).fork(count)
            assert isinstance(forks, list)
            return [self._register(copy) for copy in forks]

        return await _guard(call)

    async def close_session(self, session_id: str) -> Outcome:
        async def call() -> None:
            session = self._sessions.pop(session_id, None)
            if session is not None:
                await session.close()

        return await _guard(call)

    # --- internals ---

    def _check_room(self, scheduler: Scheduler, language: str, try_now: bool) -> None:
        if try_now and not scheduler.capacity().has_room(language):
            raise VmCapacityError(f"host {self.name} has no free VM slot now")

    def _register(self, session: Session) -> dict[str, Any]:
        self._sessions[session.session_id] = session
        return self._describe(session)

    def _describe(self, session: Session) -> dict[str, Any]:
        return {
            "id": f"{self.name}{SEPARATOR}{session.session_id}",
            "host": self.name,
            "language": session.language,
            "warm_pool_hit": session.warm_pool_hit,
            "l1_cache_hit": session.l1_cache_hit,
            "packages": session.packages,
            "exec_count": session.exec_count,
        }

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            self._sessions.pop(session_id, None)
            raise SessionClosedError(
                f"session {self.name}{SEPARATOR}{session_id} is closed, or unknown to host "
                f"{self.name} (a restarted host starts empty)"
            )
        return session

    def _prune(self) -> None:
        """Forget sessions that ended on their own (idle timeout, pause, a dead VM)."""
        for session_id in [sid for sid, s in self._sessions.items() if s.closed]:
            del self._sessions[session_id]

    @staticmethod
    def _async(function: Callable[[], _T]) -> Callable[[], Awaitable[_T]]:
        async def call() -> _T:
            return function()

        return call


async def _guard(call: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        return ("ok", await call())
    except SandboxError as exc:
        return ("err", exc)
    except Exception as exc:
        log.exception("host call failed")
        return ("err", SandboxError(f"the host failed: {type(exc).__name__}: {exc}"))


async def _streamed(
    call: Callable[[Callbacks], Awaitable[Any]], streams: tuple[str, ...]
) -> AsyncIterator[Outcome]:
    """("started", None), then the output the client asked for (streams: "stdout", "stderr",
    "boot") as it comes, then the outcome. If the client goes away, the generator is closed
    and the call cancelled."""
    queue: asyncio.Queue[Outcome] = asyncio.Queue()

    def sender(kind: str) -> Callable[[str], None] | None:
        return _sender(queue, kind) if kind in streams else None

    callbacks = Callbacks(
        on_stdout=sender("stdout"), on_stderr=sender("stderr"), on_boot_log=sender("boot")
    )

    async def outcome() -> None:
        queue.put_nowait(await _guard(lambda: call(callbacks)))

    yield ("started", None)
    task = asyncio.ensure_future(outcome())
    try:
        while True:
            item = await queue.get()
            yield item
            if item[0] in ("ok", "err"):
                return
    finally:
        if not task.done():
            task.cancel()


def _sender(queue: asyncio.Queue[Outcome], kind: str) -> Callable[[str], None]:
    def send(text: str) -> None:
        queue.put_nowait((kind, text))

    return send
