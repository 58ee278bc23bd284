"""The server's FastAPI app: the routes of docs/server.md ("Protocol"), each a thin call into the
Hub (sessions, owners, limits) or the Scheduler. Bodies are read as JSON and converted by
exec_sandbox.wire, the codec every client shares, so a result type has one JSON form.

create_app() gives the routes only; serve.py puts the authentication (auth.py) in front of them,
once per listener (the Unix socket's and TCP's differ)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import typing
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__, wire
from ..errors import InputValidationError
from ..templates import Env, Run, Step, User, Workdir
from ..vm.binding import FILE_SIZE_MAX
from . import errors, openapi, streams
from .bodies import (
    MAX_JSON_BYTES,
    exec_arguments,
    principal,
    read_json,
    require_admin,
    run_arguments,
)
from .hub import Hub, HubError, run_options

# How often a run answered by REST checks that its client is still there.
_DISCONNECT_POLL_SECONDS = 0.5
_T = typing.TypeVar("_T")
# A file's bytes go to the client in pieces of this size (read from the spool in a thread).
_CHUNK_BYTES = 1 << 20


async def _unless_gone(request: Request, work: asyncio.Future[_T]) -> _T:
    """work's result; cancelled (a run's VM destroyed) once the client has gone away, as for a
    run's WebSocket: nobody is left to read the answer."""
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=_DISCONNECT_POLL_SECONDS)
            if done:
                return work.result()
            if await request.is_disconnected():
                raise HubError(wire.BAD_REQUEST, "the client went away")
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work


def _json(value: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(wire.encode(value), status_code=status)


def _bool(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


def create_app(hub: Hub | None) -> FastAPI:
    """hub None: only to describe the routes (openapi.offline_document)."""
    app = FastAPI(
        title="exec-sandbox",
        version=__version__,
        description="Run untrusted code in microVMs: docs/server.md",
        docs_url=None,
        redoc_url=None,
    )
    app.state.hub = hub
    hub = typing.cast(Hub, hub)
    errors.install(app)
    api = APIRouter(prefix=wire.API_PREFIX)
    doc = openapi.describe

    # --- the server ---

    @api.get("/health", **doc(None, "Health"))
    async def health() -> JSONResponse:
        return _json({"status": "ok", "version": __version__})

    @api.get("/info", **doc(None, "Info"))
    async def info(request: Request) -> JSONResponse:
        who = principal(request)
        return _json(
            {
                "principal": who.name,
                "scopes": sorted(who.scopes),
                "accelerator": hub.scheduler.accelerator,
                "version": __version__,
                "limits": hub.limits(who),
            }
        )

    # --- runs and sessions ---

    @api.post("/run", **doc("RunBody", "ExecutionResult"))
    async def run(request: Request) -> JSONResponse:
        code, options = run_arguments(await read_json(request))
        work = asyncio.ensure_future(hub.run(principal(request), code, options))
        return _json(await _unless_gone(request, work))

    @api.post("/sessions", **doc("Options", "SessionInfo"))
    async def open_session(request: Request) -> JSONResponse:
        options = run_options(await read_json(request))
        entry = await hub.open_session(principal(request), options)
        return _json(hub.info(entry))

    @api.get("/sessions", **doc(None, "SessionInfo", array=True))
    async def list_sessions(request: Request) -> JSONResponse:
        return _json(hub.sessions(principal(request)))

    @api.get("/sessions/{session_id}", **doc(None, "SessionInfo"))
    async def get_session(session_id: str, request: Request) -> JSONResponse:
        return _json(hub.info(await hub.get(principal(request), session_id)))

    @api.delete("/sessions/{session_id}", status_code=204, **doc(None, None))
    async def close_session(session_id: str, request: Request) -> Response:
        await hub.close_session(principal(request), session_id)
        return Response(status_code=204)

    @api.post("/sessions/{session_id}/exec", **doc("ExecBody", "ExecutionResult"))
    async def exec_code(session_id: str, request: Request) -> JSONResponse:
        code, kwargs = exec_arguments(await read_json(request))
        entry = await hub.get(principal(request), session_id)
        return _json(await entry.session.exec(code, **kwargs))

    # --- files ---

    @api.get("/sessions/{session_id}/files", **doc(None, "FileInfo", array=True))
    async def list_files(session_id: str, request: Request, path: str = "") -> JSONResponse:
        entry = await hub.get(principal(request), session_id)
        return _json(await entry.session.list_files(path))

    @api.get("/sessions/{session_id}/files/content", **doc(None, "bytes"))
    async def read_file(session_id: str, request: Request, path: str) -> Response:
        entry = await hub.get(principal(request), session_id)
        # Spooled to an unlinked temp file, not memory (a file may be up to FILE_SIZE_MAX):
        # it is gone with its fd, however the answer ends (a client may leave mid-body).
        spool = tempfile.TemporaryFile(prefix="sbx-serve-")
        try:
            await entry.session.read_file(path, destination=spool)
            size = spool.tell()
            spool.seek(0)
        except BaseException:
            spool.close()
            raise

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while chunk := await asyncio.to_thread(spool.read, _CHUNK_BYTES):
                    yield chunk
            finally:
                spool.close()

        return StreamingResponse(
            chunks(),
            media_type="application/octet-stream",
            headers={"content-length": str(size)},
        )

    @api.put("/sessions/{session_id}/files/content", status_code=204, **doc("bytes", None))
    async def write_file(
        session_id: str, request: Request, path: str, executable: str | None = None
    ) -> Response:
        entry = await hub.get(principal(request), session_id)
        with tempfile.TemporaryFile(prefix="sbx-serve-") as spool:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > FILE_SIZE_MAX:
                    raise InputValidationError(f"content is larger than {FILE_SIZE_MAX} bytes")
                spool.write(chunk)
            spool.seek(0)
            await entry.session.write_file(path, spool, make_executable=_bool(executable))
        return Response(status_code=204)

    # --- installs, pause, fork, network ---

    @api.post("/sessions/{session_id}/install", **doc("InstallBody", "PackagesReport"))
    async def install(session_id: str, request: Request) -> JSONResponse:
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"packages", "timeout_seconds"}:
            raise InputValidationError("an install body is {packages, timeout_seconds?}")
        packages = body.get("packages")
        if not isinstance(packages, list):
            raise InputValidationError("packages must be a list of strings")
        entry = await hub.get(principal(request), session_id)
        report = await entry.session.install(packages, timeout_seconds=body.get("timeout_seconds"))
        return _json(report)

    @api.post("/sessions/{session_id}/pause", **doc(None, "SessionSnapshot"))
    async def pause(session_id: str, request: Request) -> JSONResponse:
        return _json(await hub.pause(principal(request), session_id))

    @api.post("/sessions/{session_id}/fork", **doc("ForkBody", "SessionInfo", array=True))
    async def fork(session_id: str, request: Request) -> JSONResponse:
        body = await read_json(request)
        count = body.get("count") if isinstance(body, dict) else None
        entries = await hub.fork(principal(request), session_id, count)
        return _json([hub.info(e) for e in entries])

    @api.get("/sessions/{session_id}/network_log", **doc(None, "NetworkConnection", array=True))
    async def network_log(session_id: str, request: Request) -> JSONResponse:
        entry = await hub.get(principal(request), session_id)
        return _json(entry.session.network_log)

    @api.put("/sessions/{session_id}/shared_with", **doc("SharedWithBody", "SessionInfo"))
    async def share(session_id: str, request: Request) -> JSONResponse:
        body = await read_json(request)
        names = body.get("shared_with") if isinstance(body, dict) else None
        entry = await hub.share(principal(request), session_id, names)
        return _json(hub.info(entry))

    # --- processes ---

    @api.post("/sessions/{session_id}/processes", **doc("SpawnBody", "ProcessInfo"))
    async def spawn(session_id: str, request: Request) -> JSONResponse:
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"cmd", "cwd", "env"}:
            raise InputValidationError("a process body is {cmd, cwd?, env?}")
        entry = await hub.get(principal(request), session_id)
        process = await entry.session.spawn(
            body.get("cmd"),  # type: ignore[arg-type]  # validated by spawn()
            cwd=body.get("cwd"),
            env=body.get("env"),
        )
        return _json(await process.info())

    @api.get("/sessions/{session_id}/processes", **doc(None, "ProcessInfo", array=True))
    async def list_processes(session_id: str, request: Request) -> JSONResponse:
        entry = await hub.get(principal(request), session_id)
        return _json([await p.info() for p in await entry.session.processes()])

    @api.get("/sessions/{session_id}/processes/{pid}", **doc(None, "ProcessInfo"))
    async def process_info(session_id: str, pid: int, request: Request) -> JSONResponse:
        process = await streams.find_process(hub, principal(request), session_id, pid)
        return _json(await process.info())

    @api.post("/sessions/{session_id}/processes/{pid}/stdin", status_code=204, **doc("bytes", None))
    async def process_stdin(
        session_id: str, pid: int, request: Request, close: str | None = None
    ) -> Response:
        process = await streams.find_process(hub, principal(request), session_id, pid)
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_JSON_BYTES:
                raise InputValidationError(f"stdin writes are at most {MAX_JSON_BYTES} bytes")
        if data:
            await process.write_stdin(bytes(data))
        if _bool(close):
            await process.close_stdin()
        return Response(status_code=204)

    @api.post(
        "/sessions/{session_id}/processes/{pid}/kill", status_code=204, **doc("KillBody", None)
    )
    async def process_kill(session_id: str, pid: int, request: Request) -> Response:
        body = await read_json(request)
        sig = body.get("signal", 15) if isinstance(body, dict) else 15
        process = await streams.find_process(hub, principal(request), session_id, pid)
        await process.kill(sig)
        return Response(status_code=204)

    @api.post("/sessions/{session_id}/processes/{pid}/wait", **doc(None, "ProcessInfo"))
    async def process_wait(
        session_id: str, pid: int, request: Request, timeout: float | None = None
    ) -> JSONResponse:
        process = await streams.find_process(hub, principal(request), session_id, pid)
        # Still running at the timeout: the answer says so (running: true), it is no error.
        with contextlib.suppress(TimeoutError):
            await process.wait(timeout)
        return _json(await process.info())

    # --- snapshots ---

    @api.get("/snapshots", **doc(None, "SessionSnapshot", array=True))
    async def list_snapshots(request: Request) -> JSONResponse:
        return _json(await hub.snapshots(principal(request)))

    @api.delete("/snapshots/{snapshot_id}", status_code=204, **doc(None, None))
    async def delete_snapshot(snapshot_id: str, request: Request) -> Response:
        await hub.delete_snapshot(principal(request), snapshot_id)
        return Response(status_code=204)

    @api.post("/snapshots/{snapshot_id}/resume", **doc(None, "SessionInfo"))
    async def resume(snapshot_id: str, request: Request) -> JSONResponse:
        return _json(hub.info(await hub.resume(principal(request), snapshot_id)))

    # --- templates and volumes ---

    @api.get("/templates", **doc(None, "Template", array=True))
    async def list_templates(request: Request) -> JSONResponse:
        principal(request)
        return _json(await hub.scheduler.templates())

    @api.post("/templates", **doc("TemplateBody", "Template"))
    async def build_template(request: Request) -> JSONResponse:
        require_admin(principal(request))
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"name", "image", "base", "steps"}:
            raise InputValidationError("a template body is {name, image?, base?, steps}")
        image = body.get("image")
        template = await hub.scheduler.build_template(
            body.get("name"),  # type: ignore[arg-type]  # validated by build_template()
            image=None if image is None else registry_image(image),
            base=body.get("base", "default"),
            steps=_steps(body.get("steps", [])),
        )
        return _json(template)

    @api.delete("/templates/{name}", status_code=204, **doc(None, None))
    async def delete_template(name: str, request: Request) -> Response:
        require_admin(principal(request))
        if not await hub.scheduler.delete_template(name):
            raise HubError(wire.NOT_FOUND, f"no template {name!r}")
        return Response(status_code=204)

    @api.get("/volumes", **doc(None, "Volume", array=True))
    async def list_volumes(request: Request) -> JSONResponse:
        principal(request)
        return _json(await hub.scheduler.volumes())

    @api.post("/volumes", **doc("VolumeBody", "Volume"))
    async def create_volume(request: Request) -> JSONResponse:
        require_admin(principal(request))
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"name", "size_mb"}:
            raise InputValidationError("a volume body is {name, size_mb?}")
        volume = await hub.scheduler.volume(body.get("name"), size_mb=body.get("size_mb"))  # type: ignore[arg-type]
        return _json(volume)

    @api.delete("/volumes/{name}", status_code=204, **doc(None, None))
    async def delete_volume(name: str, request: Request) -> Response:
        require_admin(principal(request))
        if not await hub.scheduler.delete_volume(name):
            raise HubError(wire.NOT_FOUND, f"no volume {name!r}")
        return Response(status_code=204)

    app.include_router(api)
    streams.add_routes(app, hub)
    if hub is not None:
        app.add_middleware(_Foreground, hub=hub)
    openapi.install(app)
    return app


# Calls that start a VM: in-process they are foreground work until the call returns; here until
# the answer is sent (else the pool refill a run triggers competes with sending its result).
_FOREGROUND_PATHS = frozenset(f"{wire.API_PREFIX}{p}" for p in ("/run", "/sessions"))


class _Foreground:
    def __init__(self, app: ASGIApp, hub: Hub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in _FOREGROUND_PATHS:
            with self.hub.scheduler.foreground():
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def registry_image(image: object) -> str:
    """A client's template image as a registry source. A path would read this host's files for
    a remote caller, so references only; and the transport is named, so that a reference is
    never taken for a path ("name:tag" is also "DIR:tag" of a layout when the server's working
    directory happens to hold a directory called name)."""
    if not isinstance(image, str) or image.startswith(("/", ".", "~", "oci:", "oci-archive:")):
        raise InputValidationError("image must be a registry reference (no host paths)")
    return image if image.startswith("docker://") else "docker://" + image


def _steps(raw: Any) -> list[Step]:
    """The JSON steps of docs/server.md; Copy is left out (it reads this host's files)."""
    if not isinstance(raw, list):
        raise InputValidationError("steps must be a list")
    steps: list[Step] = []
    for item in raw:
        if not isinstance(item, dict) or len(item) == 0:
            raise InputValidationError(f"a step is an object, got {item!r:.80}")
        if "run" in item and set(item) <= {"run", "user"}:
            steps.append(Run(item["run"], item.get("user")))
        elif set(item) == {"env"} and isinstance(item["env"], dict):
            steps.append(Env(item["env"]))
        elif set(item) == {"workdir"}:
            steps.append(Workdir(item["workdir"]))
        elif set(item) == {"user"}:
            steps.append(User(item["user"]))
        else:
            raise InputValidationError(f"unknown step {item!r:.80}")
    return steps


def openapi_document() -> dict[str, Any]:
    """The document without a running server (`sbx serve --print-openapi`, the checked-in
    docs/openapi.json): the routes need no Hub to be described."""
    return create_app(None).openapi()
