"""RemoteScheduler: Scheduler's API served by `sbx serve` (docs/server.md), over its Unix socket
or over TCP with a bearer token. It satisfies protocols.SandboxScheduler, so every integration
takes one unchanged.

Input is validated here with the same checkers as in-process (RunRequest.make() for run() and
session() options, the file, process and template checks), so a bad call raises the same
InputValidationError subclass before anything is sent; the server checks again. Errors the
server answers are raised as the library's class of their code (wire.exception_of). Output
callbacks stay here: a call with on_stdout / on_stderr streams over a WebSocket, one without is
a plain REST call. Host tools (`tools=`) are host callables and cannot cross to the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

from websockets.exceptions import ConnectionClosed

from .. import _logging, paths, wire
from ..config import SchedulerConfig
from ..errors import (
    CommunicationError,
    CommunicationOutcomeUnknownError,
    InputValidationError,
    SandboxError,
    SessionClosedError,
    SnapshotError,
    TemplateError,
)
from ..models import ExecutionResult, Language, SessionSnapshot, Template
from ..run_request import RunOptions, RunRequest
from ..snapshots.sessions import check_id
from ..templates.build import BuildRequest
from ..templates.steps import Copy, Env, Run, Step, User, Workdir
from ..validation import validate_template_name
from ..vm.execution import OutputCallback
from ..volumes import Volume, validate_volume_name
from ..volumes.volume import validate_volume_size
from . import _connection as _conn
from .session import RemoteSession

_STREAM_TEXT_MAX = 4 << 20
# close() waits this long for sessions opened for cancelled calls to be closed.
_REAP_SECONDS = 60.0  # one output message of a run/exec (the guest's chunks are far smaller)


class RemoteScheduler:
    """`async with RemoteScheduler() as remote:` (the default socket of `sbx serve`; or a socket
    path, or `"http://127.0.0.1:8642"` with a token) then `await remote.run(...)`,
    `await remote.session(...)` as on a Scheduler.

    `token`: the bearer token for TCP (default: $EXEC_SANDBOX_TOKEN; the Unix socket needs
    none). `config`: what the client validates options with (package policy) and reports as
    `config`; the server's own configuration decides everything else. `close()` closes the
    sessions this client opened (not those it attached to) and the connection."""

    def __init__(
        self,
        socket_path_or_url: str | os.PathLike[str] | None = None,
        token: str | None = None,
        *,
        config: SchedulerConfig | None = None,
    ) -> None:
        _logging.configure_from_env()
        if socket_path_or_url is None:
            socket_path_or_url = paths.server_socket()  # where `sbx serve` listens by default
        self.endpoint = _conn.Endpoint.parse(socket_path_or_url)
        token = token if token is not None else os.environ.get(_conn.TOKEN_ENV) or None
        if token is not None and (not isinstance(token, str) or not token.isprintable()):
            raise InputValidationError("token must be a printable str")
        self._token = token
        self.config = config if config is not None else SchedulerConfig()
        self._conn: _conn.Connection | None = None
        self._owned: set[RemoteSession] = set()
        # Closers of sessions the server opened for a call its caller cancelled (_opening).
        self._reapers: set[asyncio.Task[None]] = set()
        self._info: dict[str, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<RemoteScheduler {self.endpoint}>"

    async def __aenter__(self) -> RemoteScheduler:
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
        """The server's accelerator ("kvm", "hvf", "tcg"), known once started."""
        return str(self._info.get("accelerator", "remote"))

    async def start(self) -> None:
        """Connect and ask the server who this client is (GET /info): a wrong token fails
        here, not at the first run. Idempotent."""
        if self._closed:
            raise SandboxError("the remote scheduler is closed")
        if self._conn is not None:
            return
        self._conn = _conn.Connection(self.endpoint, self._token)
        try:
            info = await self._conn.call("GET", _conn.path("info"))
        except BaseException:
            conn, self._conn = self._conn, None
            await conn.aclose()
            raise
        self._info = info if isinstance(info, dict) else {}

    async def close(self) -> None:
        """Close the sessions this client opened, then the connection. Idempotent."""
        if self._closed:
            return
        for session in list(self._owned):  # while the connection still takes calls
            try:
                await session.close()
            except SandboxError:
                pass
        if self._reapers:
            _, late = await asyncio.wait(self._reapers, timeout=_REAP_SECONDS)
            for reaper in late:
                reaper.cancel()
        self._closed = True
        if self._conn is not None:
            await self._conn.aclose()

    async def info(self) -> dict[str, Any]:
        """What the server says of this client: principal, scopes, accelerator, version and
        the token's limits with their use now."""
        await self._started()
        info = await self._call_raw("GET", _conn.path("info"))
        self._info = info if isinstance(info, dict) else {}
        return dict(self._info)

    # --- run() and sessions ---

    async def run(self, code: str, **options: Unpack[RunOptions]) -> ExecutionResult:
        """Scheduler.run() on the server: a fresh VM, destroyed afterwards."""
        RunRequest.make(options, self.config, code=code, defaults=False)
        _refuse_host_only(options)
        await self._started()
        body = {"code": code, **wire.options_to_wire(options)}
        on_stdout, on_stderr = options.get("on_stdout"), options.get("on_stderr")
        if on_stdout is None and on_stderr is None:
            data = await self._call_raw("POST", _conn.path("run"), body=body, runs_code=True)
            result: ExecutionResult = _conn.decoded(ExecutionResult, data, "run()")
            return result
        return await self._streamed(_conn.path("run"), body, on_stdout, on_stderr, "run()")

    async def session(
        self, *, _packages_language: Language | None = None, **options: Unpack[RunOptions]
    ) -> RemoteSession:
        """A session on the server; on_stdout/on_stderr are the defaults of its exec() calls,
        kept here. `_packages_language` (a shell session with python packages) is not carried
        by the protocol: packages of another language than the session's are refused."""
        request = RunRequest.make(
            options, self.config, code=None, packages_language=_packages_language, defaults=False
        )
        _refuse_host_only(options)
        if request.packages and request.packages_language != request.language:
            raise InputValidationError(
                f"a {request.language} session with {request.packages_language} packages is "
                "not available through the server: install them in a template"
            )
        await self._started()
        data = await self._opening(
            self._call_raw("POST", _conn.path("sessions"), body=_session_body(options))
        )
        return self._adopt(data, options.get("on_stdout"), options.get("on_stderr"))

    async def attach(
        self,
        session_id: str,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RemoteSession:
        """A handle on a session opened by any client this token may use (its own, or one
        shared with it). Closing this client leaves it open; `session.close()` closes it."""
        if not isinstance(session_id, str) or not session_id or len(session_id) > 256:
            raise InputValidationError("session_id must be a session's id (str)")
        await self._started()
        data = await self._call_raw("GET", _conn.path("sessions", session_id))
        return RemoteSession(self, data, on_stdout, on_stderr)

    async def sessions(self) -> list[dict[str, Any]]:
        """SessionInfo (docs/server.md) of every session this token can see."""
        await self._started()
        data = await self._call_raw("GET", _conn.path("sessions"))
        if not isinstance(data, list) or not all(isinstance(i, dict) for i in data):
            raise CommunicationError("GET /sessions: the server's answer is not a list")
        return data

    async def resume(
        self,
        snapshot_id: str | SessionSnapshot,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RemoteSession:
        """A paused session back as a live one on the server (Scheduler.resume())."""
        snapshot = check_id(snapshot_id)
        await self._started()
        try:
            data = await self._opening(
                self._call_raw("POST", _conn.path("snapshots", snapshot, "resume"))
            )
        except SessionClosedError as exc:
            if getattr(exc, "code", "") == wire.NOT_FOUND:
                # As Scheduler.resume() says it: no such snapshot (or not this token's).
                raise SnapshotError(str(exc)) from None
            raise
        return self._adopt(data, on_stdout, on_stderr)

    async def snapshots(self) -> list[SessionSnapshot]:
        """The paused sessions this token can see, oldest first."""
        await self._started()
        data = await self._call_raw("GET", _conn.path("snapshots"))
        listed: list[SessionSnapshot] = _conn.decoded(
            list[SessionSnapshot],
            data,
            "snapshots()",
        )
        return listed

    async def delete_snapshot(self, snapshot_id: str | SessionSnapshot) -> bool:
        """Delete a paused session; False when the server had none of that id (for this
        token)."""
        snapshot = check_id(snapshot_id)
        await self._started()
        return await self._delete(_conn.path("snapshots", snapshot))

    # --- templates and volumes (the server's machine's) ---

    async def templates(self) -> list[Template]:
        """The templates built on the server's machine, by name."""
        await self._started()
        data = await self._call_raw("GET", _conn.path("templates"))
        listed: list[Template] = _conn.decoded(list[Template], data, "templates()")
        return listed

    async def build_template(
        self,
        name: str,
        *,
        image: str | os.PathLike[str] | None = None,
        base: str = "default",
        steps: Sequence[Step] = (),
        allowed_domains: Sequence[str] | None = None,
        memory_mb: int | None = None,
        vcpus: int | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> Template:
        """Scheduler.build_template() on the server (admin tokens; the Unix socket). `image`
        is a registry reference, or a path on the server's machine; Copy steps (host files)
        are refused. on_progress is not called: the server answers when the build ends."""
        if image is not None and (isinstance(image, os.PathLike) or _looks_like_path(image)):
            raise InputValidationError(
                "image must be a registry reference: a path would name a file of the server's "
                "machine (build the template there, or push the image to a registry)"
            )
        request = BuildRequest.make(
            name,
            image=image,
            base=base,
            steps=steps,
            allowed_domains=allowed_domains,
            memory_mb=memory_mb,
            vcpus=vcpus,
        )
        body: dict[str, Any] = {"name": request.name, "steps": [_step(s) for s in steps]}
        if image is not None:
            body["image"] = image
        if base != "default":
            body["base"] = base
        if allowed_domains is not None:
            body["allowed_domains"] = list(allowed_domains)
        if memory_mb is not None:
            body["memory_mb"] = memory_mb
        if vcpus is not None:
            body["vcpus"] = vcpus
        await self._started()
        data = await self._call_raw("POST", _conn.path("templates"), body=body)
        template: Template = _conn.decoded(Template, data, "build_template()")
        return template

    async def delete_template(self, name: str) -> bool:
        """Forget a template of the server; False when it had none of that name."""
        name = validate_template_name(name)
        await self._started()
        return await self._delete(_conn.path("templates", name))

    async def volume(self, name: str, *, size_mb: int | None = None) -> Volume:
        """The volume `name` of the server's machine, made at size_mb MB if there is none
        (Scheduler.volume(); creating one needs an admin token or the Unix socket)."""
        name = validate_volume_name(name)
        if size_mb is not None:
            size_mb = validate_volume_size(size_mb)
        await self._started()
        if size_mb is None:
            for volume in await self.volumes():
                if volume.name == name:
                    return volume
        body: dict[str, Any] = {"name": name}
        if size_mb is not None:
            body["size_mb"] = size_mb
        data = await self._call_raw("POST", _conn.path("volumes"), body=body)
        made: Volume = _conn.decoded(Volume, data, "volume()")
        return made

    async def volumes(self) -> list[Volume]:
        """The volumes of the server's machine, by name."""
        await self._started()
        data = await self._call_raw("GET", _conn.path("volumes"))
        listed: list[Volume] = _conn.decoded(list[Volume], data, "volumes()")
        return listed

    async def delete_volume(self, name: str | Volume) -> bool:
        """Delete a volume of the server; False when there was none. VolumeInUseError while a
        VM has it attached."""
        name = validate_volume_name(name.name if isinstance(name, Volume) else name)
        await self._started()
        return await self._delete(_conn.path("volumes", name))

    # --- internals (RemoteSession uses them) ---

    async def _started(self) -> None:
        if self._conn is None:
            await self.start()

    def _conn_or_raise(self) -> _conn.Connection:
        if self._closed or self._conn is None:
            raise SessionClosedError("the remote scheduler is closed")
        return self._conn

    async def _call_raw(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        content: _conn.Body | None = None,
        params: Mapping[str, Any] | None = None,
        runs_code: bool = False,
    ) -> Any:
        if self._closed:
            raise SandboxError("the remote scheduler is closed")
        return await self._conn_or_raise().call(
            method, url, body=body, content=content, params=params, runs_code=runs_code
        )

    async def _delete(self, url: str) -> bool:
        try:
            await self._call_raw("DELETE", url)
        except (SessionClosedError, TemplateError) as exc:
            if getattr(exc, "code", "") in (wire.NOT_FOUND, "template"):
                return False
            raise
        return True

    async def _streamed(
        self,
        url: str,
        body: dict[str, Any],
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        what: str,
    ) -> ExecutionResult:
        """A run or exec over its WebSocket: output to the callbacks as it comes, then the
        result. A stream that ends without one may have run the code."""
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        async with self._conn_or_raise().stream(url) as ws:
            try:
                await ws.send(json.dumps(body))
                while True:
                    message = await _conn.receive_json(ws, what)
                    kind = message.get("type")
                    if kind in callbacks:
                        data = message.get("data")
                        if not isinstance(data, str) or len(data) > _STREAM_TEXT_MAX:
                            raise CommunicationError(f"{what}: an output message without text")
                        callback = callbacks[kind]
                        if callback is not None:
                            outcome: Any = callback(data)
                            if inspect.isawaitable(outcome):
                                await outcome
                    elif kind == "result":
                        result: ExecutionResult = _conn.decoded(
                            ExecutionResult, message.get("result"), what
                        )
                        return result
                    elif kind == "error":
                        raise _conn.error_of(message)
            except ConnectionClosed as exc:
                revoked = _conn.closed_by_server(exc, what)
                if revoked is not None:
                    raise revoked from None
                raise CommunicationOutcomeUnknownError(
                    f"{what}: the server closed the stream before the result: the code may "
                    f"have run ({exc})"
                ) from None

    async def _opening(self, call: Awaitable[Any]) -> Any:
        """The answer of a call that opens sessions (session, resume, fork). A caller cancelled
        while it runs leaves the server opening them all the same: they are closed once the
        answer comes (close() waits for that), not left to the server's idle timeout."""
        task = asyncio.ensure_future(call)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            reaper = asyncio.ensure_future(self._reap(task))
            self._reapers.add(reaper)
            reaper.add_done_callback(self._reapers.discard)
            raise

    async def _reap(self, opening: asyncio.Future[Any]) -> None:
        try:
            data = await opening
        except Exception:
            return  # nothing was opened
        for info in data if isinstance(data, list) else [data]:
            if isinstance(info, dict) and isinstance(info.get("id"), str):
                with contextlib.suppress(SandboxError):
                    await self._call_raw("DELETE", _conn.path("sessions", info["id"]))

    def _adopt(
        self,
        info: Any,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RemoteSession:
        session = RemoteSession(self, info, on_stdout, on_stderr)
        if not session.closed:
            self._owned.add(session)
        return session

    def _forget(self, session: RemoteSession) -> None:
        self._owned.discard(session)


def _refuse_host_only(options: RunOptions) -> None:
    """Host tools are callables of this process: the server's VM has no way back to them."""
    if options.get("tools"):
        raise InputValidationError(
            "RemoteScheduler does not support host tools (tools=...): they are callables of "
            "this process, which the server's VMs cannot call; use a local Scheduler"
        )


def _looks_like_path(image: str) -> bool:
    return isinstance(image, str) and image.startswith(("/", ".", "~"))


def _session_body(options: RunOptions) -> dict[str, Any]:
    return wire.options_to_wire(options)


def _step(step: Step) -> dict[str, Any]:
    """A template step as the server's body has it (docs/server.md)."""
    if isinstance(step, Run):
        return {"run": step.command, **({"user": step.user} if step.user else {})}
    if isinstance(step, Env):
        return {"env": dict(step.vars)}
    if isinstance(step, Workdir):
        return {"workdir": step.path}
    if isinstance(step, User):
        return {"user": step.name}
    if isinstance(step, Copy):
        raise InputValidationError(
            "Copy steps copy files of this machine: not available through the server (build "
            "the template on the server's machine, or use Run steps)"
        )
    raise InputValidationError(f"not a template step: {step!r}")
