"""ClusterScheduler: Scheduler's run()/session() API over many hosts, on Ray.

Placement: every call asks the hosts for their capacity (cached for _INFO_TTL_SECONDS; a host
also refuses at once when it has no room, so a stale figure costs one round trip, never a wait),
tries them best first (warm-pool stock of the language, then free VM slots, then rotation), and
moves on to the next host on VmCapacityError. Only when every host refused at once does the
call queue in a host's admission; VmCapacityError reaches the caller when every host refused
that too. Failures (docs/scaling.md): a host lost before a call started is VmTransientError
(a run() or a new session is retried once on another host); a host lost after a run() or an
exec() started is CommunicationOutcomeUnknownError (never retried: code may have run); any call
to a session of a lost host raises SessionClosedError."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar, Unpack

from .. import _logging
from ..config import SchedulerConfig
from ..errors import (
    CommunicationOutcomeUnknownError,
    InputValidationError,
    SandboxError,
    SessionClosedError,
    SnapshotError,
    VmCapacityError,
    VmTransientError,
)
from ..models import (
    ExecutionResult,
    FileInfo,
    Language,
    PackagesReport,
    SessionSnapshot,
)
from ..run_request import RunOptions, RunRequest
from ..scheduler import HostCapacity
from ..snapshots.sessions import check_id
from ..vm.execution import OutputCallback
from . import _ray
from .host import SEPARATOR, SandboxHost

NAMESPACE = "exec_sandbox"
HOST_RESOURCE = "sandbox_host"
HOST_NAME_PREFIX = "sandbox-host-"
_T = TypeVar("_T")
_INFO_TTL_SECONDS = 1.0
# The first info() of a host starts its Scheduler (the accelerator probe may start QEMU).
_INFO_TIMEOUT_SECONDS = 120.0
_SHUTDOWN_TIMEOUT_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class HostInfo:
    """One host of the cluster as it reported itself."""

    name: str
    hostname: str
    pid: int
    accelerator: str
    capacity: HostCapacity
    sessions: int
    runs: int
    uptime_seconds: float

    @classmethod
    def from_wire(cls, info: Mapping[str, Any]) -> HostInfo:
        fields = dict(info)
        fields["capacity"] = HostCapacity(**fields["capacity"])
        return cls(**fields)


class _HostLost(Exception):
    """Ray could not reach the host before the call started (internal: mapped per call)."""


@dataclasses.dataclass
class _Host:
    name: str
    handle: _ray.Handle
    info: HostInfo | None = None


class ClusterScheduler:
    """`async with ClusterScheduler(address="ray://..." or "HOST:PORT", config=...) as c:` then
    `await c.run(...)` and `await c.session(...)` as on a Scheduler.

    Hosts are the live Ray nodes advertising the `sandbox_host` resource; each gets one named,
    detached host actor (created by the first client that needs it, with that client's
    `config`; later clients use it as it is). `config` fields left at their defaults are
    resolved on each host (paths, the derived max_concurrent_vms). `close()` closes the sessions
    this client opened and disconnects; the hosts stay for other clients (`shutdown_hosts()`
    ends them and their VMs)."""

    def __init__(
        self,
        address: str | None = None,
        config: SchedulerConfig | None = None,
        *,
        namespace: str = NAMESPACE,
        host_resource: str = HOST_RESOURCE,
    ) -> None:
        _logging.configure_from_env()
        self.address = address
        self.config = config if config is not None else SchedulerConfig()
        self._config_fields = _changed_fields(self.config)
        self._namespace = namespace
        self._resource = host_resource
        self._hosts: dict[str, _Host] = {}
        self._info_at = 0.0
        self._turn = itertools.count()
        self._owned: set[ClusterSession] = set()
        self._connected_here = False
        self._started = False
        self._closed = False

    async def __aenter__(self) -> ClusterScheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def accelerator(self) -> str:
        return "cluster"

    async def start(self) -> None:
        """Connect to Ray (unless this process already is) and find the hosts."""
        if self._started:
            return
        if not _ray.is_initialized():
            _ray.init(self.address, self._namespace)
            self._connected_here = True
        self._started = True
        await self._refresh(force=True)

    async def close(self) -> None:
        """Close the sessions this client opened (not the ones it attached to) and disconnect
        from Ray if start() connected. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for session in list(self._owned):
            await session.close()
        if self._connected_here:
            _ray.shutdown()

    async def hosts(self) -> list[HostInfo]:
        """Every live host and what it reports now (hosts that do not answer are left out)."""
        await self._refresh(force=True)
        return [h.info for h in self._hosts.values() if h.info is not None]

    async def doctor(self) -> list[dict[str, Any]]:
        """Each host's `sbx doctor` checks and its capacity; a host that does not answer is
        listed with its error."""
        await self.start()
        await self._discover()
        out: list[dict[str, Any]] = []
        for host in list(self._hosts.values()):
            try:
                report = await _checked(
                    host, await _await(_ray.call(host.handle, "doctor"), _INFO_TIMEOUT_SECONDS)
                )
            except _HostLost as exc:
                report = {"info": {"name": host.name}, "error": str(exc), "healthy": False}
            out.append(report)
        return out

    async def shutdown_hosts(self) -> None:
        """End every host actor: each closes its Scheduler (its VMs and sessions end), then the
        actor is killed. The next client to connect creates new, empty hosts."""
        await self.start()
        await self._discover()
        for host in list(self._hosts.values()):
            try:
                await _await(_ray.call(host.handle, "shutdown"), _SHUTDOWN_TIMEOUT_SECONDS)
            except _HostLost:
                pass
            _ray.kill(host.handle)
        self._hosts.clear()

    # --- run() ---

    async def run(self, code: str, **options: Unpack[RunOptions]) -> ExecutionResult:
        """Scheduler.run() on a host with room; same result and errors. See the module's
        docstring for placement and what a lost host raises. The request is validated here,
        before any host is asked, and sent as it is (run_request.RunRequest); time and memory
        left out are the host's defaults, as with a local scheduler."""
        request = RunRequest.make(options, self.config, code=code, defaults=False)
        _refuse_tools(options)
        callbacks = {
            "stdout": options.get("on_stdout"),
            "stderr": options.get("on_stderr"),
            "boot": options.get("on_boot_log"),
        }
        streams = tuple(kind for kind, cb in callbacks.items() if cb is not None)

        async def attempt(host: _Host, try_now: bool) -> ExecutionResult:
            items = _ray.stream(host.handle, "run", request, streams, try_now)
            result = await _consume(host, items, callbacks, what="run()")
            assert isinstance(result, ExecutionResult)
            return result

        return await self._place(request.language, attempt, what="run()")

    # --- sessions ---

    async def session(
        self, *, _packages_language: Language | None = None, **options: Unpack[RunOptions]
    ) -> ClusterSession:
        """A session on a host with room; it stays on that host (ClusterSession forwards every
        call there). on_stdout/on_stderr are the defaults of each exec(), kept here.
        `_packages_language`: as Scheduler.session()'s."""
        request = RunRequest.make(
            options, self.config, code=None, packages_language=_packages_language, defaults=False
        )
        _refuse_tools(options)
        on_boot_log = options.get("on_boot_log")
        callbacks = {"boot": on_boot_log}
        streams = ("boot",) if on_boot_log is not None else ()

        async def attempt(host: _Host, try_now: bool) -> ClusterSession:
            items = _ray.stream(host.handle, "open_session", request, streams, try_now)
            info = await _consume(host, items, callbacks, what="session()", after_start=False)
            return self._adopt(
                host, info, options.get("on_stdout"), options.get("on_stderr"), owned=True
            )

        return await self._place(request.language, attempt, what="session()")

    async def attach(
        self,
        session_id: str,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ClusterSession:
        """A proxy for a live session opened by any client (its `session_id`). Closing this
        client leaves it open; `session.close()` closes it for everyone."""
        await self.start()
        name, sep, local_id = str(session_id).partition(SEPARATOR)
        if not sep or not name.startswith(HOST_NAME_PREFIX) or not local_id:
            raise InputValidationError(f"not a cluster session id: {session_id!r}")
        handle = _ray.get_actor(name, self._namespace)
        if handle is None:
            raise SessionClosedError(f"session {session_id}: host {name} does not exist (any more)")
        host = self._hosts.get(name) or _Host(name, handle)
        try:
            info = await _checked(host, await _await(_ray.call(handle, "session_info", local_id)))
        except _HostLost as exc:
            raise SessionClosedError(f"session {session_id}: {exc}") from exc
        return self._adopt(host, info, on_stdout, on_stderr, owned=False)

    async def resume(
        self,
        snapshot_id: str | SessionSnapshot,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ClusterSession:
        """Scheduler.resume() on a host with room that can reach the snapshot (the host that
        paused it, or any host sharing its snapshot directory); SnapshotError when none can."""
        snapshot = str(snapshot_id)
        unreachable: list[str] = []

        async def attempt(host: _Host, try_now: bool) -> ClusterSession:
            try:
                info = await _checked(
                    host, await _await(_ray.call(host.handle, "resume", snapshot, try_now))
                )
            except SnapshotError as exc:
                unreachable.append(f"{host.name}: {exc}")
                raise VmCapacityError(str(exc)) from exc  # next host
            return self._adopt(host, info, on_stdout, on_stderr, owned=True)

        try:
            return await self._place("python", attempt, what="resume()")
        except VmCapacityError:
            if unreachable:
                raise SnapshotError("; ".join(unreachable)) from None
            raise

    async def snapshots(self) -> list[SessionSnapshot]:
        """Paused sessions every host can see (each listed once)."""
        await self._refresh(force=True)
        seen: dict[str, SessionSnapshot] = {}
        for host in list(self._hosts.values()):
            try:
                listed = await _checked(host, await _await(_ray.call(host.handle, "snapshots")))
            except _HostLost:
                continue
            for snapshot in listed:
                seen.setdefault(snapshot.id, snapshot)
        return sorted(seen.values(), key=lambda s: s.created_at)

    async def delete_snapshot(self, snapshot_id: str | SessionSnapshot) -> bool:
        """Remove a paused session from every host that can see it; False when none had it."""
        snapshot_id = check_id(snapshot_id)
        await self._refresh(force=True)
        deleted = False
        for host in list(self._hosts.values()):
            try:
                outcome = await _await(_ray.call(host.handle, "delete_snapshot", snapshot_id))
                deleted = bool(await _checked(host, outcome)) or deleted
            except _HostLost:
                continue
        return deleted

    # --- internals ---

    def _adopt(
        self,
        host: _Host,
        info: Mapping[str, Any],
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        *,
        owned: bool,
    ) -> ClusterSession:
        session = ClusterSession(self, host, info, on_stdout, on_stderr)
        if owned:
            self._owned.add(session)
        return session

    def _forget(self, session: ClusterSession) -> None:
        self._owned.discard(session)

    async def _place(
        self, language: str, attempt: Callable[[_Host, bool], Awaitable[_T]], what: str
    ) -> _T:
        """attempt(host, try_now) on the best host, then the next: first every host with
        try_now (refuse when full), then again letting a host's admission queue the call."""
        if self._closed:
            raise SandboxError("the cluster scheduler is closed")
        await self.start()
        retried = False
        refused: list[str] = []
        for try_now in (True, False):
            await self._refresh(force=try_now is False)
            for host in self._ranked(language):
                try:
                    return await attempt(host, try_now)
                except VmCapacityError as exc:
                    refused.append(f"{host.name}: {exc}")
                    continue
                except _HostLost as exc:
                    self._hosts.pop(host.name, None)
                    if retried:
                        raise VmTransientError(
                            f"{what} could not start: {exc} (retried once on another host)"
                        ) from exc
                    retried = True
        if not refused:
            raise VmCapacityError(
                f"{what}: no sandbox host in the cluster (no live node "
                f"advertises the {self._resource!r} resource)"
            )
        raise VmCapacityError(f"{what}: every host refused: " + "; ".join(refused))

    def _ranked(self, language: str) -> list[_Host]:
        hosts = [h for h in self._hosts.values() if h.info is not None]
        if not hosts:
            return []
        turn = next(self._turn) % len(hosts)

        def key(indexed: tuple[int, _Host]) -> tuple[int, int, int, int]:
            i, host = indexed
            assert host.info is not None
            cap = host.info.capacity
            return (
                -cap.warm_pool.get(language, 0),
                -cap.free_vms,
                cap.waiting,
                (i - turn) % len(hosts),
            )

        return [h for _, h in sorted(enumerate(hosts), key=key)]

    async def _discover(self) -> None:
        """The host actors of the live nodes (created where missing); lost nodes dropped."""
        nodes = _ray.alive_nodes(self._resource)
        names = {HOST_NAME_PREFIX + node: node for node in nodes}
        for name in list(self._hosts):
            if name not in names:
                del self._hosts[name]
        for name, node in names.items():
            if name not in self._hosts:
                handle = _ray.host_actor(
                    SandboxHost,
                    name,
                    self._namespace,
                    node,
                    self._resource,
                    name,
                    self._config_fields,
                )
                self._hosts[name] = _Host(name, handle)

    async def _refresh(self, force: bool = False) -> None:
        """Hosts and their info, at most every _INFO_TTL_SECONDS unless forced."""
        if not force and time.monotonic() - self._info_at < _INFO_TTL_SECONDS:
            return
        await self._discover()

        async def ask(host: _Host) -> None:
            try:
                info = await _checked(
                    host, await _await(_ray.call(host.handle, "info"), _INFO_TIMEOUT_SECONDS)
                )
                host.info = HostInfo.from_wire(info)
            except (_HostLost, SandboxError):
                host.info = None  # not placed on until it answers again

        await asyncio.gather(*(ask(h) for h in list(self._hosts.values())))
        self._info_at = time.monotonic()


class ClusterSession:
    """A session living on one host, driven from any client: every call goes to that host.
    Same members as Session; `session_id` is "<host>/<id>", which any client can attach()."""

    def __init__(
        self,
        cluster: ClusterScheduler,
        host: _Host,
        info: Mapping[str, Any],
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> None:
        self._cluster = cluster
        self._host = host
        self.session_id: str = info["id"]
        self._local_id = self.session_id.partition(SEPARATOR)[2]
        self.host: str = info["host"]
        self.language: Language = info["language"]
        self.warm_pool_hit: bool = info["warm_pool_hit"]
        self.l1_cache_hit: bool = info["l1_cache_hit"]
        self.packages: PackagesReport | None = info["packages"]
        self.exec_count: int = info["exec_count"]
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._closed = False
        self._close_reason = ""

    @property
    def close_reason(self) -> str:
        """Why the session closed ("" while it is open): closed by the caller, paused, idle for
        its timeout, its VM failed, its REPL was killed."""
        return self._close_reason

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> ClusterSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def exec(
        self,
        code: str,
        *,
        timeout_seconds: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Session.exec() on the session's host. Never retried: a host lost after the code was
        sent raises CommunicationOutcomeUnknownError, and the session is then closed."""
        self._check_open()
        callbacks = {"stdout": on_stdout or self._on_stdout, "stderr": on_stderr or self._on_stderr}
        streams = tuple(kind for kind, cb in callbacks.items() if cb is not None)
        options = {"timeout_seconds": timeout_seconds, "env_vars": dict(env_vars or {}) or None}
        items = _ray.stream(self._host.handle, "exec", self._local_id, code, options, streams)
        try:
            result, self.exec_count = await _consume(self._host, items, callbacks, what="exec()")
        except (_HostLost, CommunicationOutcomeUnknownError) as exc:
            self._mark_closed(f"host {self.host} was lost: {exc}")
            if isinstance(exc, _HostLost):
                raise SessionClosedError(f"session {self.session_id} is closed: {exc}") from exc
            raise
        except SessionClosedError as exc:
            self._mark_closed(str(exc))
            raise
        assert isinstance(result, ExecutionResult)
        return result

    async def write_file(
        self, path: str, content: bytes | Path | IO[bytes], *, make_executable: bool = False
    ) -> None:
        """Session.write_file(); the bytes travel to the host through Ray's object store."""
        self._check_open()
        data = await _content_bytes(content)
        await self._call("write_file", self._local_id, path, _ray.put(data), make_executable)

    async def read_file(
        self, path: str, *, destination: Path | IO[bytes] | None = None
    ) -> bytes | None:
        """Session.read_file(); the bytes come back through Ray's object store."""
        self._check_open()
        refs = await self._call("read_file", self._local_id, path)
        try:
            data: bytes = await refs[0]
        except _ray.RayError as exc:
            self._mark_closed(f"host {self.host} was lost: {exc}")
            raise SessionClosedError(f"session {self.session_id}: host lost: {exc}") from exc
        if destination is None:
            return data
        if isinstance(destination, Path):
            await asyncio.get_running_loop().run_in_executor(None, destination.write_bytes, data)
        else:
            destination.write(data)
        return None

    async def list_files(self, path: str = "") -> list[FileInfo]:
        self._check_open()
        listed: list[FileInfo] = await self._call("list_files", self._local_id, path)
        return listed

    async def install(
        self, packages: Sequence[str], *, timeout_seconds: float | None = None
    ) -> PackagesReport:
        """Session.install() on the session's host (its cache, its index configuration)."""
        self._check_open()
        if isinstance(packages, (str, bytes)):
            raise InputValidationError("packages must be a list of strings")
        report: PackagesReport = await self._call(
            "install", self._local_id, list(packages), timeout_seconds
        )
        return report

    async def pause(self) -> SessionSnapshot:
        """Session.pause() on the host; ClusterScheduler.resume() brings it back on any host
        that can reach the snapshot."""
        self._check_open()
        snapshot: SessionSnapshot = await self._call("pause", self._local_id)
        self._mark_closed(f"paused as snapshot {snapshot.id}")
        return snapshot

    async def fork(self, count: int | None = None) -> ClusterSession | list[ClusterSession]:
        """Session.fork(): the copies live on this session's host (they share its memory)."""
        self._check_open()
        infos = await self._call("fork", self._local_id, 1 if count is None else count)
        copies = [self._cluster._adopt(self._host, info, None, None, owned=True) for info in infos]
        return copies if count is not None else copies[0]

    async def spawn(self, cmd: Any, **options: Any) -> Any:
        """Not over the cluster: a process handle pulls its output from the VM in many small
        requests, which the host actor does not relay (yet). Raises NotImplementedError."""
        raise NotImplementedError(_NO_PROCESSES)

    async def processes(self) -> Any:
        raise NotImplementedError(_NO_PROCESSES)

    async def terminal(self, cols: int = 80, rows: int = 24, **options: Any) -> Any:
        raise NotImplementedError(_NO_PROCESSES)

    async def close(self) -> None:
        """Close the session on its host (for every client attached to it). Idempotent; a
        lost host has closed it already."""
        if self._closed:
            return
        self._mark_closed("closed by the caller")
        try:
            await _checked(
                self._host,
                await _await(_ray.call(self._host.handle, "close_session", self._local_id)),
            )
        except (_HostLost, SandboxError):
            pass

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"session {self.session_id} is closed: {self._close_reason}")

    def _mark_closed(self, reason: str) -> None:
        if not self._closed:
            self._closed = True
            self._close_reason = reason
            self._cluster._forget(self)

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await _checked(
                self._host, await _await(_ray.call(self._host.handle, method, *args))
            )
        except _HostLost as exc:
            self._mark_closed(f"host {self.host} was lost: {exc}")
            raise SessionClosedError(f"session {self.session_id} is closed: {exc}") from exc
        except SessionClosedError as exc:
            self._mark_closed(str(exc))
            raise


# --- helpers ---


_NO_PROCESSES = (
    "background processes and terminals are not available through ClusterScheduler: use a "
    "Scheduler on the host (spawn/processes/terminal of Session)"
)


async def _await(ref: _ray.Ref, timeout: float | None = None) -> Any:
    """A call's raw outcome; Ray's own failures (the host is gone) become _HostLost."""
    try:
        if timeout is None:
            return await ref
        return await asyncio.wait_for(ref, timeout)
    except _ray.RayError as exc:
        raise _HostLost(f"host unreachable ({type(exc).__name__}: {_first_line(exc)})") from exc
    except TimeoutError as exc:
        raise _HostLost(f"host did not answer within {timeout:.0f} s") from exc


async def _checked(host: _Host, outcome: tuple[str, Any]) -> Any:
    kind, value = outcome
    if kind == "err":
        raise value
    return value


async def _consume(
    host: _Host,
    items: AsyncIterator[tuple[str, Any]],
    callbacks: Mapping[str, OutputCallback | None],
    *,
    what: str,
    after_start: bool = True,
) -> Any:
    """Drive one streamed host call: output to the callbacks, then the value or the error.
    A host lost before "started" is _HostLost (nothing ran); after it, for calls that run code
    (after_start), CommunicationOutcomeUnknownError."""
    started = False
    try:
        async for kind, value in items:
            if kind == "started":
                started = True
            elif kind == "ok":
                return value
            elif kind == "err":
                raise value
            else:
                callback = callbacks.get(kind)
                if callback is not None:
                    callback(value)
    except _ray.RayError as exc:
        reason = f"host {host.name} was lost ({type(exc).__name__}: {_first_line(exc)})"
        if started and after_start:
            raise CommunicationOutcomeUnknownError(
                f"{what}: {reason} after the call reached it: the code may have run"
            ) from exc
        raise _HostLost(reason) from exc
    raise _HostLost(f"host {host.name} ended the call without an outcome")


async def _content_bytes(content: bytes | Path | IO[bytes]) -> bytes:
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    if isinstance(content, Path):
        return await asyncio.get_running_loop().run_in_executor(None, content.read_bytes)
    if hasattr(content, "read"):
        return bytes(content.read())
    raise InputValidationError(
        f"content must be bytes, a Path or a binary file object, got {type(content).__name__}"
    )


def _changed_fields(config: SchedulerConfig) -> dict[str, Any]:
    """The fields of config that differ from a default SchedulerConfig made here: the rest
    (cache paths, the max_concurrent_vms derived from this machine) each host derives itself."""
    baseline = SchedulerConfig()
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(baseline, f.name)
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _refuse_tools(options: RunOptions) -> None:
    """Host tools run in the caller's process, and a cluster host's VM has no way back to it
    yet: refused clearly rather than offered to code that could never reach them. Templates
    live in one machine's cache, and a cluster has no way yet to build or ship one to each
    host; volumes are disks of one machine, locked there."""
    if options.get("tools"):
        raise InputValidationError(
            "ClusterScheduler does not support host tools (tools=...): use a local Scheduler"
        )
    if options.get("template") not in (None, "default"):
        raise InputValidationError(
            "ClusterScheduler does not support templates (template=...): use a local Scheduler"
        )
    if options.get("volumes"):
        raise InputValidationError(
            "ClusterScheduler does not support volumes (volumes=...): a volume is a disk of "
            "one machine; use a local Scheduler"
        )
