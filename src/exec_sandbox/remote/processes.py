"""Processes and terminals of a remote session: `RemoteProcess` and `RemoteTerminal`, the same
members as processes.Process and processes.Terminal, over the server's process endpoints and
WebSockets (docs/server.md, "Streaming").

A RemoteProcess is a pid and its session, as a local handle is: each `stdout` / `stderr` reader
attaches a WebSocket of its own that replays what the guest still holds, so readers started late
or from another client see the same bytes. A RemoteTerminal owns its WebSocket: the terminal
lives as long as that connection (closing it hangs the terminal up), as an ssh session does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import signal as _signal
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Literal, Protocol

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..errors import CommunicationError, InputValidationError, SessionClosedError
from ..processes import ProcessInfo, validate_signal, validate_terminal_size
from . import _connection as _conn


class ProcessHost(Protocol):
    """What a handle asks its session for (RemoteSession): one REST call on the session, the
    URL of one of its paths, a WebSocket to it, and whether it is still open."""

    async def _call(
        self,
        method: str,
        *parts: str,
        body: Any = None,
        content: _conn.Body | None = None,
        params: Mapping[str, Any] | None = None,
        runs_code: bool = False,
    ) -> Any: ...

    def _url(self, *parts: str) -> str: ...

    def _stream(self, url: str) -> AbstractAsyncContextManager[ClientConnection]: ...

    def _check_open(self) -> None: ...


Stream = Literal["stdout", "stderr"]
ProcessOutputCallback = Callable[[bytes], "Awaitable[None] | None"]
# What one output message may carry (the guest's chunks are 64 KiB; base64 and JSON add a third).
_CHUNK_MAX_BYTES = 4 << 20
# The longest wait one request asks the server to hold: a closed session is noticed by then.
_WAIT_STEP_SECONDS = 30.0


class RemoteProcessOutput:
    """One reader of a remote process's stdout or stderr: an async iterator of bytes from the
    oldest byte the guest still holds to the end of the process. Its WebSocket opens on the
    first read and closes at the end, on aclose(), or when the iterator is dropped."""

    def __init__(self, process: RemoteProcess, stream: Stream) -> None:
        self._process = process
        self._stream = stream
        self._chunks: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> RemoteProcessOutput:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            self._chunks = self._process._attach(self._stream)
        return await self._chunks.__anext__()

    async def read(self) -> bytes:
        """Everything from the start to the end of the stream (waits for the process to end)."""
        return b"".join([chunk async for chunk in self])

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()  # type: ignore[attr-defined]


class RemoteProcess:
    """A process in a remote session's VM (`await session.spawn()`, `session.processes()`).
    Operations raise SessionClosedError once the session is closed or paused."""

    def __init__(self, session: ProcessHost, info: ProcessInfo) -> None:
        self._session = session
        self.pid = info.pid
        self.command = info.command
        self.pty = info.pty
        self._exit_code: int | None = info.exit_code
        self._callback_tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        state = "running" if self._exit_code is None else f"exit {self._exit_code}"
        return f"<{type(self).__name__} pid={self.pid} {self.command!r} {state}>"

    @property
    def exit_code(self) -> int | None:
        """The exit code once this client saw the process end (wait(), info(), a reader's
        end); None before. 128+N when killed by signal N."""
        return self._exit_code

    @property
    def returncode(self) -> int | None:
        return self._exit_code

    @property
    def stdout(self) -> RemoteProcessOutput:
        """A new reader of stdout, from the oldest byte the guest still holds."""
        return RemoteProcessOutput(self, "stdout")

    @property
    def stderr(self) -> RemoteProcessOutput:
        """A new reader of stderr (always empty for a process with a terminal)."""
        return RemoteProcessOutput(self, "stderr")

    async def info(self) -> ProcessInfo:
        """What the guest knows of the process now."""
        data = await self._session._call("GET", "processes", str(self.pid))
        return self._update(_conn.decoded(ProcessInfo, data, "process info"))

    async def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code; TimeoutError after `timeout`
        seconds (the process goes on)."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
        ):
            raise InputValidationError("timeout must be None or a number of seconds >= 0")
        if self._exit_code is not None:
            return self._exit_code
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            # The server holds each request up to its timeout and answers the state then.
            left = _WAIT_STEP_SECONDS if deadline is None else deadline - loop.time()
            step = round(max(0.0, min(left, _WAIT_STEP_SECONDS)), 3)
            data = await self._session._call(
                "POST", "processes", str(self.pid), "wait", params={"timeout": step}
            )
            info = self._update(_conn.decoded(ProcessInfo, data, "process wait"))
            if info.exit_code is not None:
                return info.exit_code
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")

    async def write_stdin(self, data: bytes | str) -> None:
        """Write to the process's stdin (a str as UTF-8); returns once the guest wrote it.
        BrokenPipeError once stdin is closed or the process has ended."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InputValidationError("data must be bytes or str")
        await self._stdin(bytes(data), close=False)

    async def close_stdin(self) -> None:
        """Close the process's stdin (it reads end of file). Idempotent while it runs."""
        with contextlib.suppress(BrokenPipeError):
            await self._stdin(b"", close=True)

    async def kill(self, signal: int = _signal.SIGTERM) -> None:
        """Send `signal` (default SIGTERM) to the process's group; nothing once it has ended."""
        sig = validate_signal(signal)
        try:
            await self._session._call(
                "POST", "processes", str(self.pid), "kill", body={"signal": sig}
            )
        except ProcessLookupError:
            pass

    def send_signal(self, signal: int) -> Awaitable[None]:
        return self.kill(signal)

    async def terminate(self) -> None:
        await self.kill(_signal.SIGTERM)

    # --- internals ---

    async def _stdin(self, data: bytes, *, close: bool) -> None:
        try:
            await self._session._call(
                "POST",
                "processes",
                str(self.pid),
                "stdin",
                content=data,
                params={"close": True} if close else None,
            )
        except ProcessLookupError:
            raise BrokenPipeError(
                f"stdin of process {self.pid} is closed (or the process has ended)"
            ) from None

    def _update(self, info: ProcessInfo) -> ProcessInfo:
        if info.exit_code is not None:
            self._exit_code = info.exit_code
        return info

    async def _attach(self, stream: Stream) -> AsyncIterator[bytes]:
        """The chunks of one stream from a WebSocket attached to the process."""
        url = self._session._url("processes", str(self.pid))
        async with self._session._stream(url) as ws:
            while True:
                try:
                    message = await _conn.receive_json(ws, f"process {self.pid}")
                except ConnectionClosed as exc:
                    self._session._check_open()
                    raise _conn.closed_by_server(exc, f"process {self.pid}") or CommunicationError(
                        f"process {self.pid}: the server closed the stream before its exit"
                    ) from None
                kind = message.get("type")
                if kind == stream:
                    data = _chunk(message.get("data"), self.pid)
                    if data:
                        yield data
                elif kind == "exit":
                    code = message.get("exit_code")
                    if isinstance(code, int) and not isinstance(code, bool):
                        self._exit_code = code
                    return
                elif kind == "error":
                    raise _conn.error_of(message)

    def _start_callbacks(
        self, on_stdout: ProcessOutputCallback | None, on_stderr: ProcessOutputCallback | None
    ) -> None:
        for stream, callback in (("stdout", on_stdout), ("stderr", on_stderr)):
            if callback is not None:
                reader = RemoteProcessOutput(self, stream)  # type: ignore[arg-type]
                task = asyncio.get_running_loop().create_task(self._pump(reader, callback))
                self._callback_tasks.add(task)
                task.add_done_callback(self._callback_tasks.discard)

    async def _pump(self, reader: RemoteProcessOutput, callback: ProcessOutputCallback) -> None:
        try:
            async for chunk in reader:
                try:
                    result = callback(chunk)
                    if inspect.isawaitable(result):
                        await result
                except Exception as exc:
                    warnings.warn(
                        f"output callback of process {self.pid} raised {exc!r}; disabled",
                        RuntimeWarning,
                        stacklevel=1,
                    )
                    return
        except (SessionClosedError, CommunicationError):
            return  # the session ended: there is no more output to hand over
        finally:
            await reader.aclose()

    def _stop_callbacks(self) -> None:
        for task in list(self._callback_tasks):
            task.cancel()


class RemoteTerminal:
    """A terminal in a remote session's VM (`await session.terminal()`): keystrokes in with
    write(), output with `async for chunk in terminal` or read(), resize(), close() (hangs it
    up). Its WebSocket is the terminal: it ends when this handle closes."""

    def __init__(self, session: ProcessHost, ws: ClientConnection, cols: int, rows: int) -> None:
        self._session = session
        self._ws = ws
        self.cols = cols
        self.rows = rows
        self.pty = True
        self._exit_code: int | None = None
        self._ended = False
        self._next: asyncio.Future[bytes] | None = None

    @property
    def exit_code(self) -> int | None:
        """The shell's exit code once it ended (None before, or when close() hung it up)."""
        return self._exit_code

    @property
    def returncode(self) -> int | None:
        return self._exit_code

    def __aiter__(self) -> RemoteTerminal:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read()
        if not data:
            raise StopAsyncIteration
        return data

    async def read(self, timeout: float | None = None) -> bytes:
        """The next output (b"" once the terminal's process has ended); TimeoutError after
        `timeout` seconds without any (what comes later is returned by the next read)."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._receive())
        done, _ = await asyncio.wait({self._next}, timeout=timeout)
        if not done:
            raise TimeoutError(f"no output from the terminal within {timeout} s")
        chunk, self._next = self._next, None
        return chunk.result()

    async def write(self, data: bytes | str) -> None:
        """Keystrokes (a str as UTF-8): "\\x03" is Ctrl-C, "\\x04" Ctrl-D, "\\r" Enter."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InputValidationError("data must be bytes or str")
        await self._send(bytes(data))

    async def write_stdin(self, data: bytes | str) -> None:
        await self.write(data)

    async def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size; the program gets SIGWINCH."""
        cols, rows = validate_terminal_size(cols, rows)
        await self._send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        self.cols, self.rows = cols, rows

    async def wait(self, timeout: float | None = None) -> int:
        """Wait for the shell to end (reading and dropping its output); its exit code."""
        async with asyncio.timeout(timeout):
            while await self.read():
                pass
        if self._exit_code is None:
            raise SessionClosedError("the terminal ended without an exit code")
        return self._exit_code

    async def close(self, timeout: float = 5.0) -> int | None:
        """Hang up (the server sends SIGHUP to the terminal's process group); returns its exit
        code when it had ended already, else None. Idempotent."""
        if self._next is not None and not self._next.done():
            self._next.cancel()
        self._ended = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.close(), timeout)
        return self._exit_code

    async def __aenter__(self) -> RemoteTerminal:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _send(self, message: bytes | str) -> None:
        if self._ended:
            raise BrokenPipeError("the terminal has ended")
        try:
            await self._ws.send(message)
        except ConnectionClosed:
            self._ended = True
            raise BrokenPipeError("the terminal has ended") from None

    async def _receive(self) -> bytes:
        while not self._ended:
            try:
                message = await self._ws.recv()
            except ConnectionClosed as exc:
                self._ended = True
                self._session._check_open()
                revoked = _conn.closed_by_server(exc, "terminal")
                if revoked is not None:
                    raise revoked from None
                return b""
            if isinstance(message, bytes):
                if message:
                    return message
                continue
            event = _conn.json_object(message, "terminal")
            if event.get("type") == "exit":
                code = event.get("exit_code")
                if isinstance(code, int) and not isinstance(code, bool):
                    self._exit_code = code
                self._ended = True
            elif event.get("type") == "error":
                self._ended = True
                raise _conn.error_of(event)
        return b""


def _chunk(data: Any, pid: int) -> bytes:
    if not isinstance(data, dict) or not isinstance(data.get("base64"), str):
        raise CommunicationError(f"process {pid}: an output message without base64 data")
    if len(data["base64"]) > _CHUNK_MAX_BYTES:
        raise CommunicationError(f"process {pid}: an output message over {_CHUNK_MAX_BYTES} bytes")
    try:
        return base64.b64decode(data["base64"], validate=True)
    except ValueError:
        raise CommunicationError(f"process {pid}: output that is not base64") from None
