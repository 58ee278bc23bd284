"""The server's WebSockets (docs/server.md, "Streaming"): run and exec output as the code writes
it, a spawned process's output and stdin, and a terminal.

The VM's reader must never wait for a client: output callbacks put messages into a bounded
outbox (_Outbox) and a separate task sends them. A client that falls OUTBOX_BYTES behind is
disconnected (close code 1013), and the work then goes on as for a client that went away: a run
is cancelled (its VM destroyed), a session's exec runs to its end with its output dropped. A
process's output is read from the guest once per stream, however many clients are attached
(fanout.py), each client with a bounded queue of its own; a terminal's is pulled from the
guest's buffer as fast as its one client takes it (the guest keeps the last 1 MiB)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from .. import wire
from .._futures import retrieve
from ..errors import InputValidationError
from ..models import ExecutionResult
from ..processes import Process, Terminal
from ..run_request import RunOptions
from .bodies import exec_arguments, run_arguments
from .errors import error_of
from .fanout import Fanouts
from .hub import Hub, HubError
from .tokens import Principal

log = logging.getLogger(__name__)

# Output not yet sent to a client, at most: a quarter of what one call may print (stdout 1 MiB,
# stderr 100 KiB), so that a client that stopped reading is found out while the code runs and
# the server holds little for it (the socket buffers hold a few hundred KiB more). A client
# that reads keeps the outbox near empty.
OUTBOX_BYTES = 256 << 10
# The first message of a run or exec: its JSON body (code up to 1 MB, escaped, with options).
MAX_REQUEST_BYTES = 8 << 20
FIRST_MESSAGE_SECONDS = 30.0


class _Outbox:
    """Messages for one client, in order. put() never blocks (it is called by the VM's reader);
    past OUTBOX_BYTES pending the client is declared too slow and later messages dropped."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[dict[str, Any], int] | None] = asyncio.Queue()
        self._pending = 0
        self.overflowed = asyncio.Event()

    def put(self, message: dict[str, Any], size: int) -> None:
        if self.overflowed.is_set():
            return
        if self._pending + size > OUTBOX_BYTES:
            self.overflowed.set()
            return
        self._pending += size
        self._queue.put_nowait((message, size))

    def finish(self) -> None:
        self._queue.put_nowait(None)

    async def pump(self, ws: WebSocket) -> None:
        """Send until finish(); raises when the client is gone."""
        while (item := await self._queue.get()) is not None:
            message, size = item
            await ws.send_text(json.dumps(message))
            self._pending -= size


def _principal(ws: WebSocket) -> Principal:
    found = ws.scope.get("state", {}).get("principal")
    if not isinstance(found, Principal):
        raise HubError(wire.UNAUTHORIZED, "no principal for this connection")
    return found


async def _first_message(ws: WebSocket) -> Any:
    """The request: the client's first message, a JSON text frame, within FIRST_MESSAGE_SECONDS
    (a connection that never asks is not kept open)."""
    try:
        message = await asyncio.wait_for(ws.receive(), FIRST_MESSAGE_SECONDS)
    except TimeoutError:
        raise HubError(wire.BAD_REQUEST, "no request within the time allowed") from None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if not isinstance(text, str):
        raise HubError(wire.BAD_REQUEST, "the request is a JSON text message")
    if len(text) > MAX_REQUEST_BYTES:
        raise HubError(wire.BAD_REQUEST, "the request is too large")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise HubError(wire.BAD_REQUEST, f"the request is not JSON: {exc}") from None


async def _until_gone(ws: WebSocket) -> None:
    """Returns when the client disconnects (what it sends after its request is ignored)."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


async def _finish(ws: WebSocket, message: dict[str, Any]) -> None:
    """Send the final message and close (quietly, if the client is gone already)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        if ws.application_state == WebSocketState.CONNECTED:
            await ws.send_text(json.dumps(message))
            await ws.close()


async def _error(ws: WebSocket, exc: BaseException) -> None:
    _, body = error_of(exc)
    await _finish(ws, {"type": "error", **body})


async def _stream_execution(
    ws: WebSocket,
    hub: Hub,
    start: Callable[[Callable[[str], None], Callable[[str], None]], Awaitable[ExecutionResult]],
    *,
    cancel_when_gone: bool,
) -> None:
    """Run start(on_stdout, on_stderr), its output streamed to ws, then its result. When the
    client goes away (or falls too far behind): cancel the work (a run), or let it finish in
    the background (a session's exec: the session stays consistent)."""
    outbox = _Outbox()

    def on_stdout(text: str) -> None:
        outbox.put({"type": "stdout", "data": text}, len(text))

    def on_stderr(text: str) -> None:
        outbox.put({"type": "stderr", "data": text}, len(text))

    work = asyncio.ensure_future(start(on_stdout, on_stderr))
    sender = asyncio.ensure_future(outbox.pump(ws))
    gone = asyncio.ensure_future(_until_gone(ws))
    slow = asyncio.ensure_future(outbox.overflowed.wait())
    try:
        await asyncio.wait({work, sender, gone, slow}, return_when=asyncio.FIRST_COMPLETED)
        if work.done() and not (gone.done() or slow.done() or sender.done()):
            outbox.finish()
            with contextlib.suppress(Exception):
                await sender  # everything the code wrote goes before the result
            if work.cancelled():
                return
            exc = work.exception()
            if exc is not None:
                await _error(ws, exc)
            else:
                await _finish(ws, {"type": "result", "result": wire.encode(work.result())})
            return
        # The client left, stopped reading, or could not be written to.
        if slow.done():
            with contextlib.suppress(Exception):
                await ws.close(wire.CLOSE_TOO_SLOW, "the client did not keep up with the output")
        if cancel_when_gone:
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
        else:
            hub.keep(work)
            work.add_done_callback(_log_outcome)
    finally:
        for task in (sender, gone, slow):
            task.cancel()
        if cancel_when_gone and not work.done():
            work.cancel()  # this handler itself was cancelled (the server stops)


def _log_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("an exec whose client went away failed: %s", task.exception())


async def find_process(hub: Hub, who: Principal, session_id: str, pid: int) -> Process:
    entry = await hub.get(who, session_id)
    for process in await entry.session.processes():
        if process.pid == pid:
            return process
    raise HubError(wire.NOT_FOUND, f"no process {pid} in session {session_id}")


def add_routes(app: FastAPI, hub: Hub) -> None:
    prefix = wire.API_PREFIX
    fanouts = Fanouts()

    @app.websocket(f"{prefix}/run")
    async def run_stream(ws: WebSocket) -> None:
        await ws.accept()
        try:
            who = _principal(ws)
            code, options = run_arguments(await _first_message(ws))
        except WebSocketDisconnect:
            return
        except Exception as exc:
            await _error(ws, exc)
            return

        async def start(out: Callable[[str], None], err: Callable[[str], None]) -> Any:
            streamed: RunOptions = options.copy()
            streamed["on_stdout"] = out
            streamed["on_stderr"] = err
            return await hub.run(who, code, streamed)

        await _stream_execution(ws, hub, start, cancel_when_gone=True)

    @app.websocket(f"{prefix}/sessions/{{session_id}}/exec")
    async def exec_stream(ws: WebSocket, session_id: str) -> None:
        await ws.accept()
        try:
            who = _principal(ws)
            code, kwargs = exec_arguments(await _first_message(ws))
            entry = await hub.get(who, session_id)
        except WebSocketDisconnect:
            return
        except Exception as exc:
            await _error(ws, exc)
            return

        async def start(out: Callable[[str], None], err: Callable[[str], None]) -> Any:
            return await entry.session.exec(code, on_stdout=out, on_stderr=err, **kwargs)

        await _stream_execution(ws, hub, start, cancel_when_gone=False)

    @app.websocket(f"{prefix}/sessions/{{session_id}}/processes/{{pid}}")
    async def process_stream(ws: WebSocket, session_id: str, pid: int) -> None:
        await ws.accept()
        try:
            process = await find_process(hub, _principal(ws), session_id, pid)
        except Exception as exc:
            await _error(ws, exc)
            return
        await _attach(ws, fanouts, session_id, process)

    @app.websocket(f"{prefix}/sessions/{{session_id}}/terminal")
    async def terminal_stream(ws: WebSocket, session_id: str) -> None:
        await ws.accept()
        try:
            entry = await hub.get(_principal(ws), session_id)
            cols = int(ws.query_params.get("cols", "80"))
            rows = int(ws.query_params.get("rows", "24"))
            terminal = await entry.session.terminal(cols, rows)
        except ValueError:
            await _error(ws, InputValidationError("cols and rows are integers"))
            return
        except Exception as exc:
            await _error(ws, exc)
            return
        await _terminal(ws, terminal)


async def _attach(ws: WebSocket, fanouts: Fanouts, session_id: str, process: Process) -> None:
    """A process's output from the oldest byte the guest holds, then its exit; the client's
    stdin, close_stdin and kill. The process goes on when the client leaves; a client that
    falls behind is closed (wire.CLOSE_TOO_SLOW) and may attach again."""

    async def pump(stream: str) -> None:
        with fanouts.attach(session_id, process, stream) as subscriber:
            async for chunk in subscriber:
                data = base64.b64encode(bytes(chunk)).decode("ascii")
                await ws.send_text(json.dumps({"type": stream, "data": {"base64": data}}))
            if subscriber.too_slow:
                with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                    await ws.close(wire.CLOSE_TOO_SLOW)
                raise WebSocketDisconnect(wire.CLOSE_TOO_SLOW)
            if subscriber.failure is not None:
                raise subscriber.failure

    async def commands() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                command = json.loads(message.get("text") or "null")
                kind = command.get("type") if isinstance(command, dict) else None
                if kind == "stdin":
                    data = command.get("data")
                    if not isinstance(data, dict) or not isinstance(data.get("base64"), str):
                        raise InputValidationError("stdin data is {base64}")
                    await process.write_stdin(base64.b64decode(data["base64"], validate=True))
                elif kind == "close_stdin":
                    await process.close_stdin()
                elif kind == "kill":
                    await process.kill(command.get("signal", 15))
                else:
                    raise InputValidationError(f"unknown message {str(command)[:80]!r}")
            except Exception as exc:  # a bad command is reported; the stream goes on
                _, body = error_of(exc)
                await ws.send_text(json.dumps({"type": "error", **body}))

    streams = ["stdout"] if process.pty else ["stdout", "stderr"]
    pumps = [asyncio.ensure_future(pump(s)) for s in streams]
    output: asyncio.Future[Any] = asyncio.gather(*pumps)
    listener: asyncio.Future[Any] = asyncio.ensure_future(commands())
    try:
        await asyncio.wait({output, listener}, return_when=asyncio.FIRST_COMPLETED)
        if output.done() and not listener.done():
            failure = output.exception()
            if failure is not None:
                await _error(ws, failure)
                return
            try:
                exit_code = await process.wait()
            except Exception as exc:
                await _error(ws, exc)
                return
            await _finish(ws, {"type": "exit", "exit_code": exit_code})
    finally:
        # Each pump too: a gather that failed leaves its other pump running, which would
        # keep its subscription (and the shared guest reader) while that stream is quiet.
        for task in (*pumps, output, listener):
            task.cancel()
            # What they end with (a client gone mid-send) is nobody's once the stream is over.
            task.add_done_callback(retrieve)


async def _terminal(ws: WebSocket, terminal: Terminal) -> None:
    """Binary frames both ways; a text {"type": "resize"} resizes; the client leaving hangs up
    (SIGHUP), as an ssh session's end does."""

    async def pump() -> None:
        async for chunk in terminal:
            await ws.send_bytes(bytes(chunk))

    async def keys() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes"):
                await terminal.write(message["bytes"])
            elif message.get("text"):
                try:
                    command = json.loads(message["text"])
                    if not isinstance(command, dict) or command.get("type") != "resize":
                        raise InputValidationError("the only text message is resize")
                    await terminal.resize(command.get("cols"), command.get("rows"))  # type: ignore[arg-type]
                except Exception as exc:
                    _, body = error_of(exc)
                    await ws.send_text(json.dumps({"type": "error", **body}))

    output = asyncio.ensure_future(pump())
    listener = asyncio.ensure_future(keys())
    try:
        await asyncio.wait({output, listener}, return_when=asyncio.FIRST_COMPLETED)
        if output.done() and not listener.done():
            try:
                exit_code = await terminal.wait()
            except Exception as exc:
                await _error(ws, exc)
                return
            await _finish(ws, {"type": "exit", "exit_code": exit_code})
    finally:
        for task in (output, listener):
            task.cancel()
        if terminal.exit_code is None:
            with contextlib.suppress(Exception):
                await terminal.close()
