"""RemoteSession: a session of `sbx serve`, with Session's members (protocols.SandboxSession,
plus processes, terminals and sharing). The server's Session orders the calls and keeps the
state; this proxy holds what the server last said of it (SessionInfo: docs/server.md) and
the callbacks, which stay in the caller's process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, TypeVar

from websockets.asyncio.client import ClientConnection

from .. import wire
from ..errors import (
    CommunicationError,
    InputValidationError,
    SessionClosedError,
)
from ..models import (
    ExecutionResult,
    ExposedPort,
    FileInfo,
    Language,
    NetworkConnection,
    PackagesReport,
    SessionSnapshot,
)
from ..processes import (
    TERMINAL_SHELL,
    ProcessInfo,
    validate_argv,
    validate_cwd,
    validate_terminal_size,
)
from ..results import EXIT_SIGKILL
from ..validation import validate_code, validate_env, validate_timeout
from ..vm import file_transfer
from ..vm.execution import OutputCallback
from . import _connection as _conn
from .processes import ProcessOutputCallback, RemoteProcess, RemoteTerminal

_T = TypeVar("_T")
_MAX_FORKS = 16
_UPLOAD_CHUNK = 1 << 20


class SessionOwner(Protocol):
    """What a session asks the client that made it for (RemoteScheduler): REST calls, the
    connection for streams, a streamed run or exec, and its table of the sessions it opened."""

    async def _call_raw(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        content: _conn.Body | None = None,
        params: Mapping[str, Any] | None = None,
        runs_code: bool = False,
    ) -> Any: ...

    def _conn_or_raise(self) -> _conn.Connection: ...

    async def _streamed(
        self,
        url: str,
        body: dict[str, Any],
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        what: str,
    ) -> ExecutionResult: ...

    def _adopt(
        self, info: Any, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None
    ) -> RemoteSession: ...

    def _forget(self, session: RemoteSession) -> None: ...

    async def _opening(self, call: Awaitable[Any]) -> Any: ...


class RemoteSession:
    """A live session on the server. Create with `await remote.session(...)` (or resume, fork).

    `session_id` is the server's id: another client with access (the owner's token, one it is
    shared with: `share()`) drives the same VM with `remote.attach(session_id)`. Properties hold
    what the server last reported; `await refresh()` asks again."""

    # From the server's SessionInfo (_apply).
    session_id: str
    language: Language
    owner: str
    shared_with: tuple[str, ...]
    exec_count: int
    created_at: float
    _installed: tuple[str, ...]
    _exposed_ports: list[ExposedPort]

    def __init__(
        self,
        scheduler: SessionOwner,
        info: Mapping[str, Any],
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._closed = False
        self._close_reason = ""
        self._network_log: list[NetworkConnection] = []
        self._handles: dict[int, RemoteProcess] = {}
        self._apply(info)

    # --- state ---

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str:
        """Why the session closed ("" while it is open), as the server said."""
        return self._close_reason

    @property
    def exposed_ports(self) -> list[ExposedPort]:
        """The guest ports reachable on the server's host (expose_ports), while open. Their
        host is the server's: from another machine, reach them through it."""
        return [] if self._closed else list(self._exposed_ports)

    @property
    def network_log(self) -> list[NetworkConnection]:
        """The connections of this session's exec() calls made through this handle (each
        result's network_log), oldest first; `await fetch_network_log()` has every one."""
        return list(self._network_log)

    @property
    def installed(self) -> tuple[str, ...]:
        """Every package the VM has ("name==version"), as of the last answer of the server."""
        return self._installed

    async def refresh(self) -> None:
        """Ask the server for the session's state now (exec_count, closed, installed, ports)."""
        self._apply(await self._call("GET"))

    async def fetch_network_log(self) -> list[NetworkConnection]:
        """Every connection of the session so far, allowed or refused (oldest first)."""
        data = await self._call("GET", "network_log")
        log = _conn.decoded(list[NetworkConnection], data, "network log")
        self._network_log = list(log)
        return self.network_log

    # --- code ---

    async def exec(
        self,
        code: str,
        *,
        timeout_seconds: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run code in the session's REPL on the server; state persists between calls. With
        callbacks (given here or to session()) the output streams over a WebSocket as it is
        written."""
        validate_code(code)
        if timeout_seconds is not None:
            validate_timeout(timeout_seconds)
        validate_env(env_vars)
        self._check_open()
        body: dict[str, Any] = {"code": code}
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        if env_vars:
            body["env_vars"] = dict(env_vars)
        stdout = on_stdout if on_stdout is not None else self._on_stdout
        stderr = on_stderr if on_stderr is not None else self._on_stderr
        if stdout is None and stderr is None:
            data = await self._call("POST", "exec", body=body, runs_code=True)
            result: ExecutionResult = _conn.decoded(ExecutionResult, data, "exec()")
        else:
            result = await self._guard(
                self._scheduler._streamed(self._url("exec"), body, stdout, stderr, "exec()")
            )
        self.exec_count += 1
        self._network_log.extend(result.network_log)
        if result.exit_code == EXIT_SIGKILL:
            # The server's Session closes itself on a REPL killed for good (the contract).
            self._mark_closed("the REPL was killed by SIGKILL (exit 137)")
        return result

    async def install(
        self, packages: Sequence[str], *, timeout_seconds: float | None = None
    ) -> PackagesReport:
        """Session.install() on the server (its index, its package cache)."""
        if isinstance(packages, str | bytes) or not all(isinstance(p, str) for p in packages):
            raise InputValidationError("packages must be a list of strings")
        if not packages:
            raise InputValidationError("install() needs at least one package")
        if timeout_seconds is not None:
            validate_timeout(timeout_seconds)
        body: dict[str, Any] = {"packages": list(packages)}
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        data = await self._call("POST", "install", body=body, runs_code=True)
        report: PackagesReport = _conn.decoded(PackagesReport, data, "install()")
        self._installed = (*self._installed, *report.packages)
        return report

    # --- files ---

    async def write_file(
        self, path: str, content: bytes | Path | IO[bytes], *, make_executable: bool = False
    ) -> None:
        """Write content (bytes, a Path or a binary file object) to path under /home/user in
        the VM. Atomic: the file appears whole or not at all."""
        file_transfer.guest_path(path)
        self._check_open()
        data = await _upload(content)
        await self._call(
            "PUT",
            "files",
            "content",
            content=data,
            params={"path": path, "executable": bool(make_executable)},
        )

    async def read_file(
        self, path: str, *, destination: Path | IO[bytes] | None = None
    ) -> bytes | None:
        """The file's bytes, or None once written to destination (a Path or binary file)."""
        file_transfer.guest_path(path)
        self._check_open()
        loop = asyncio.get_running_loop()
        parts: list[bytes] = []
        sink_file: IO[bytes] | None = None
        if isinstance(destination, Path):
            sink_file = await loop.run_in_executor(None, destination.open, "wb")
        elif destination is not None:
            if not hasattr(destination, "write"):
                raise InputValidationError("destination must be a Path or a binary file object")
            sink_file = destination

        async def sink(chunk: bytes) -> None:
            if sink_file is None:
                parts.append(chunk)
            else:
                await loop.run_in_executor(None, sink_file.write, chunk)

        try:
            await self._guard(
                self._scheduler._conn_or_raise().download(
                    self._url("files", "content"), {"path": path}, sink
                )
            )
        finally:
            if isinstance(destination, Path) and sink_file is not None:
                await loop.run_in_executor(None, sink_file.close)
        return b"".join(parts) if destination is None else None

    async def list_files(self, path: str = "") -> list[FileInfo]:
        """Entries of a directory under /home/user ("" = the home itself), sorted by name."""
        file_transfer.guest_path(path, allow_empty=True)
        data = await self._call("GET", "files", params={"path": path or None})
        listed: list[FileInfo] = _conn.decoded(list[FileInfo], data, "list_files()")
        return listed

    # --- lifecycle ---

    async def pause(self) -> SessionSnapshot:
        """Pause on the server (the session closes); `remote.resume(snapshot)` brings it back."""
        data = await self._call("POST", "pause")
        snapshot: SessionSnapshot = _conn.decoded(SessionSnapshot, data, "pause()")
        self._mark_closed(f"paused as snapshot {snapshot.id}")
        return snapshot

    async def fork(self, count: int | None = None) -> RemoteSession | list[RemoteSession]:
        """Live copies on the server: `fork()` one session, `fork(n)` a list of n."""
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_FORKS
        ):
            raise InputValidationError(f"count must be an integer from 1 to {_MAX_FORKS}")
        data = await self._scheduler._opening(self._call("POST", "fork", body={"count": count}))
        if not isinstance(data, list) or len(data) != (count or 1):
            raise CommunicationError("fork(): the server answered another number of sessions")
        copies = [self._scheduler._adopt(info, None, None) for info in data]
        return copies if count is not None else copies[0]

    async def share(self, names: Sequence[str]) -> None:
        """Let the tokens of these names use the session (replacing the list; [] for none).
        Only its owner or an admin may."""
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise InputValidationError("share() takes a list of token names")
        self._apply(await self._call("PUT", "shared_with", body={"shared_with": list(names)}))

    async def close(self) -> None:
        """Close the session on the server (for every client using it). Idempotent."""
        if self._closed:
            return
        self._mark_closed("closed by the caller")
        for handle in self._handles.values():
            handle._stop_callbacks()
        with contextlib.suppress(SessionClosedError, CommunicationError):
            await self._scheduler._call_raw("DELETE", self._url())

    async def __aenter__(self) -> RemoteSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- processes and terminals ---

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: ProcessOutputCallback | None = None,
        on_stderr: ProcessOutputCallback | None = None,
    ) -> RemoteProcess:
        """Start a process in the VM beside its executions (Session.spawn())."""
        validate_argv(cmd)
        validate_cwd(cwd)
        if env is not None:
            if not isinstance(env, Mapping):
                raise InputValidationError("env must be a mapping of str to str")
            validate_env(env)
        for name, callback in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
            if callback is not None and not callable(callback):
                raise InputValidationError(f"{name} must be callable")
        body: dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else list(cmd)}
        if cwd is not None:
            body["cwd"] = cwd
        if env is not None:
            body["env"] = dict(env)
        data = await self._call("POST", "processes", body=body)
        process = self._handle(_conn.decoded(ProcessInfo, data, "spawn()"))
        process._start_callbacks(on_stdout, on_stderr)
        return process

    async def processes(self) -> list[RemoteProcess]:
        """Every process the guest tracks (running, or ended with its record kept), oldest
        first: the handles spawn() gave, new ones for the others."""
        data = await self._call("GET", "processes")
        infos: list[ProcessInfo] = _conn.decoded(list[ProcessInfo], data, "processes()")
        return [self._handle(info) for info in infos]

    async def terminal(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        cmd: str | Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RemoteTerminal:
        """A terminal of cols x rows running the image's login shell (Session.terminal()).
        Over the server a terminal is always the shell: cmd, cwd and env are refused."""
        cols, rows = validate_terminal_size(cols, rows)
        if cmd is not None and cmd != TERMINAL_SHELL or cwd is not None or env is not None:
            raise InputValidationError(
                "a terminal through the server runs the login shell: cmd=, cwd= and env= are "
                "not available (spawn() a process for a command)"
            )
        self._check_open()
        ws = await self._guard(
            self._scheduler._conn_or_raise().open_stream(
                self._url("terminal"), {"cols": cols, "rows": rows}
            )
        )
        return RemoteTerminal(self, ws, cols, rows)

    # --- internals ---

    def _apply(self, info: Any) -> None:
        """Take the server's SessionInfo (checked: it is the server's word about a VM)."""
        if not isinstance(info, Mapping) or not isinstance(info.get("id"), str):
            raise CommunicationError("the server's answer is not a SessionInfo")
        try:
            self.session_id = info["id"]
            self.language = info.get("language", "python")
            self.owner = str(info.get("owner", ""))
            self.shared_with = tuple(
                _conn.decoded(list[str], info.get("shared_with", []), "SessionInfo")
            )
            self.exec_count = int(info.get("exec_count", 0))
            self.created_at = float(info.get("created_at", 0.0))
            self._installed = tuple(
                _conn.decoded(list[str], info.get("installed", []), "SessionInfo")
            )
            self._exposed_ports = _conn.decoded(
                list[ExposedPort],
                info.get("exposed_ports", []),
                "SessionInfo",
            )
        except (TypeError, ValueError) as exc:
            raise CommunicationError(f"the server's SessionInfo is malformed: {exc}") from None
        if info.get("closed"):
            self._mark_closed(str(info.get("close_reason", "")) or "closed on the server")

    def _handle(self, info: ProcessInfo) -> RemoteProcess:
        handle = self._handles.get(info.pid)
        if handle is None or handle.command != info.command:
            handle = RemoteProcess(self, info)
            self._handles[info.pid] = handle
        handle._update(info)
        return handle

    def _url(self, *parts: str) -> str:
        return _conn.path("sessions", self.session_id, *parts)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"session {self.session_id} is closed: {self._close_reason}")

    def _mark_closed(self, reason: str) -> None:
        if not self._closed:
            self._closed = True
            self._close_reason = reason
            self._scheduler._forget(self)

    async def _call(
        self,
        method: str,
        *parts: str,
        body: Any = None,
        content: _conn.Body | None = None,
        params: Mapping[str, Any] | None = None,
        runs_code: bool = False,
    ) -> Any:
        """One REST call on this session; a session_closed answer, or not_found for the
        session itself, closes this handle too. A process call's not_found for its pid is
        ProcessLookupError (the session goes on)."""
        self._check_open()
        call = self._scheduler._call_raw(
            method,
            self._url(*parts),
            body=body,
            content=content,
            params=params,
            runs_code=runs_code,
        )
        if parts[:1] != ("processes",) or len(parts) < 2:
            return await self._guard(call)
        try:
            return await call
        except SessionClosedError as exc:
            if getattr(exc, "code", "") == wire.NOT_FOUND and not _about_session(exc):
                raise ProcessLookupError(str(exc)) from None
            self._mark_closed(str(exc))
            raise

    async def _guard(self, call: Awaitable[_T]) -> _T:
        """call's outcome; a session_closed or not_found answer closes this handle too (the
        server has no such session, or no more)."""
        try:
            return await call
        except SessionClosedError as exc:
            self._mark_closed(str(exc))
            raise

    def _stream(self, url: str) -> AbstractAsyncContextManager[ClientConnection]:
        self._check_open()
        return self._scheduler._conn_or_raise().stream(url)


def _about_session(exc: BaseException) -> bool:
    # The server's not_found for a session says "no session ID"; for a pid, "no process N"
    # or the guest's "process N: ...".
    return str(exc).startswith("no session")


async def _upload(content: bytes | Path | IO[bytes]) -> _conn.Body:
    """What to send for write_file(): bytes as they are; a Path or a file object read in
    chunks off the event loop, so a large file never sits in memory whole."""
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    if isinstance(content, Path):
        loop = asyncio.get_running_loop()
        handle: IO[bytes] = await loop.run_in_executor(None, content.open, "rb")
        return _chunks(handle, close=True)
    if hasattr(content, "read"):
        return _chunks(content, close=False)
    raise InputValidationError(
        f"content must be bytes, a Path or a binary file object, got {type(content).__name__}"
    )


async def _chunks(handle: IO[bytes], *, close: bool) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    try:
        while True:
            chunk = await loop.run_in_executor(None, handle.read, _UPLOAD_CHUNK)
            if not chunk:
                return
            if not isinstance(chunk, bytes | bytearray):
                raise InputValidationError("the file object must be opened in binary mode")
            yield bytes(chunk)
    finally:
        if close:
            await loop.run_in_executor(None, handle.close)
