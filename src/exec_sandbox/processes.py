"""Background processes and terminals of a session: `Process`, `Terminal` (docs/design.md,
"Background processes" and "Terminal").

Processes live in the VM: the guest agent tracks them by pid and keeps the last bytes of each
output stream in a ring addressed by absolute offset (protocol.h, "Processes"). A handle here is
only a pid and the session to ask: it holds no output. Readers pull chunks from an offset with a
bounded wait, so any number of readers, before or after a pause, each get what they missed, and
host memory never holds more than the chunk being handed over. A new host process (resume) or a
fork asks `session.processes()` for handles to the same pids.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal as _signal
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .errors import InputValidationError, SandboxError, SessionClosedError
from .validation import validate_env
from .vm.binding import PATH_MAX, PROC, ProcDataEvent, ProcessEntry, ProcInfoEvent
from .vm.guest import GuestRequestError

if TYPE_CHECKING:
    from .vm.binding import Event


class ProcessHost(Protocol):
    """What a handle asks its session for (Session._process_request): one process request to
    the guest, failing with SessionClosedError once the session is closed."""

    async def _process_request(
        self,
        send: Callable[[Any, int, int], int],
        expect: str,
        *,
        held: bool,
        hold_ms: int = 0,
        timeout: float | None = 30.0,
    ) -> Event: ...


log = logging.getLogger("exec_sandbox")

Stream = Literal["stdout", "stderr"]
# A callback for a process's output: bytes as they come, sync or async.
ProcessOutputCallback = Callable[[bytes], "Awaitable[None] | None"]

PROC_ARGV_MAX = PROC["PROC_ARGV_MAX"]
PROC_ARG_MAX = PROC["PROC_ARG_MAX"]
TERMINAL_SIZE_MAX = PROC["PROC_TTY_MAX"]
PROC_TRACKED_MAX = PROC["PROC_TRACKED_MAX"]
# How long the guest holds one PROC_READ / PROC_WAIT before answering empty: long enough that an
# idle reader costs a frame every half minute, short of the protocol's PROC_WAIT_MS_MAX.
_HOLD_MS = 30_000
# Held requests of one VM at once, below the guest's PROC_PENDING_MAX (which a resumed guest may
# still partly spend on requests of the previous host process): past it, readers poll instead.
HELD_MAX = PROC["PROC_PENDING_MAX"] - 16
POLL_SECONDS = 0.2
# Host-side allowance on top of a request's hold (TCG guests under load answer late).
REPLY_GRACE_SECONDS = 15.0
ERR_LIMIT = PROC["ERR_LIMIT"]
PTY_FLAG = PROC["PROC_PTY"]
_STREAMS: dict[Stream, int] = {"stdout": PROC["PROC_STDOUT"], "stderr": PROC["PROC_STDERR"]}
TERMINAL_ENV = {"TERM": "xterm-256color"}
# The image's bash as a login, interactive shell, or its sh where an image has no bash.
TERMINAL_SHELL = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash --login -i; else exec sh -l -i; fi",
]


class ProcessError(SandboxError):
    """A process request the guest refused: the program could not be started (not found, not
    executable, a missing cwd), or the sandbox's limit of PROC_MAX running processes."""


class OutputGap(bytes):
    """What a process's output iterator yields where the guest's buffer dropped bytes that this
    reader had not read yet (the buffer keeps each stream's last 1 MiB): a readable marker line,
    `dropped` says how many bytes are missing. Tell it from output with isinstance()."""

    dropped: int

    def __new__(cls, dropped: int) -> OutputGap:
        gap = super().__new__(
            cls, f"\n[exec-sandbox: {dropped} bytes of output dropped]\n".encode()
        )
        gap.dropped = dropped
        return gap


@dataclass(frozen=True)
class ProcessInfo:
    """What the guest knows of a process now (`await process.info()`)."""

    pid: int
    command: str  # argv joined by spaces, cut to 128 bytes
    running: bool
    exit_code: int | None  # None while running; 128+N when killed by signal N
    pty: bool
    stdin_open: bool
    stdout_bytes: int  # produced so far (the guest keeps the last 1 MiB of each)
    stderr_bytes: int


def _info(entry: ProcessEntry) -> ProcessInfo:
    running = bool(entry.flags & PROC["PROC_RUNNING"])
    return ProcessInfo(
        pid=entry.pid,
        command=entry.command,
        running=running,
        exit_code=None if running else entry.exit_code,
        pty=bool(entry.flags & PROC["PROC_PTY"]),
        stdin_open=bool(entry.flags & PROC["PROC_STDIN_OPEN"]),
        stdout_bytes=entry.stdout_bytes,
        stderr_bytes=entry.stderr_bytes,
    )


# --- validation (before anything reaches the VM) ---


def validate_argv(cmd: str | Sequence[str]) -> list[bytes]:
    """A str runs through the image's shell (`sh -c cmd`); a list is the argv itself."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InputValidationError("cmd must not be empty")
        args: list[str] = ["sh", "-c", cmd]
    elif isinstance(cmd, Sequence) and not isinstance(cmd, (bytes, bytearray)):
        args = list(cmd)
        if not args:
            raise InputValidationError("cmd must not be an empty list")
        if len(args) > PROC_ARGV_MAX:
            raise InputValidationError(f"cmd has more than {PROC_ARGV_MAX} arguments")
    else:
        raise InputValidationError(f"cmd must be a str or a list of str, got {type(cmd).__name__}")
    argv: list[bytes] = []
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise InputValidationError(f"argument {i} must be a str, got {type(arg).__name__}")
        raw = arg.encode()
        if not raw:
            raise InputValidationError(f"argument {i} is empty")
        if b"\0" in raw:
            raise InputValidationError(f"argument {i} contains a NUL byte")
        if len(raw) > PROC_ARG_MAX:
            raise InputValidationError(f"argument {i} is longer than {PROC_ARG_MAX} bytes")
        argv.append(raw)
    # The whole request is one frame of at most 2 MiB (with the environment).
    if sum(len(a) + 4 for a in argv) > 1024 * 1024:
        raise InputValidationError("cmd's arguments are larger than 1 MiB together")
    return argv


def validate_cwd(cwd: str | None) -> bytes:
    if cwd is None:
        return b""
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise InputValidationError("cwd must be an absolute path (str)")
    raw = cwd.encode()
    if b"\0" in raw or len(raw) > PATH_MAX:
        raise InputValidationError(f"cwd must have no NUL byte and at most {PATH_MAX} bytes")
    return raw


def validate_terminal_size(cols: object, rows: object) -> tuple[int, int]:
    for name, value in (("cols", cols), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputValidationError(f"{name} must be an int")
        if not 1 <= value <= TERMINAL_SIZE_MAX:
            raise InputValidationError(f"{name} must be from 1 to {TERMINAL_SIZE_MAX}")
    assert isinstance(cols, int) and isinstance(rows, int)
    return cols, rows


def validate_signal(sig: object) -> int:
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise InputValidationError("signal must be an int or a signal.Signals")
    if not 1 <= int(sig) <= 64:
        raise InputValidationError("signal must be from 1 to 64")
    return int(sig)


def spawn_env(
    base: Mapping[str, str], extra: Mapping[str, str] | None
) -> list[tuple[bytes, bytes]]:
    if extra is not None and not isinstance(extra, Mapping):
        raise InputValidationError("env must be a mapping of str to str")
    return validate_env({**base, **(extra or {})})


# --- handles ---


class ProcessOutput:
    """One reader of a process's stdout or stderr: an async iterator of bytes from the first
    byte the guest still holds. Ends when the stream has ended (the process closed it, usually
    by exiting) and everything before was read. Where the guest's buffer dropped bytes this
    reader had not read, an `OutputGap` comes first."""

    def __init__(self, process: Process, stream: Stream, offset: int = 0) -> None:
        self._process = process
        self._stream = stream
        self.offset = offset  # the stream offset of the next byte this reader wants
        self._eof = False
        self._stash: bytes | None = None  # data that came with a gap, handed over after it
        self._missed = 0  # bytes this reader never got: the sum of its gaps

    def __aiter__(self) -> ProcessOutput:
        return self

    async def __anext__(self) -> bytes:
        if self._stash is not None:
            data, self._stash = self._stash, None
            return data
        while not self._eof:
            data, offset, eof = await self._process._read(self._stream, self.offset)
            gap = offset - self.offset
            if gap:
                self._missed += gap
                self._process._count_dropped(self._stream, self._missed)
            self.offset = offset + len(data)
            self._eof = eof
            if gap:
                self._stash = data or None
                return OutputGap(gap)
            if data:
                return data
        raise StopAsyncIteration

    async def read(self) -> bytes:
        """Everything from this reader's offset to the end of the stream (waits for it)."""
        return b"".join([chunk async for chunk in self])


class Process:
    """A process running in the session's VM beside its executions (`await session.spawn()`).

    `stdout` / `stderr` give a new reader each time, starting at the oldest byte the guest
    still holds; callbacks given to spawn() are run by a task this handle owns. Operations raise
    SessionClosedError once the session is closed or paused (the process goes on in a paused
    snapshot: `session.processes()` of the resumed session gives it back)."""

    def __init__(self, session: ProcessHost, pid: int, command: str, pty: bool) -> None:
        self._session = session
        self.pid = pid
        self.command = command
        self.pty = pty
        self._exit_code: int | None = None
        self._write_lock = asyncio.Lock()
        self._dropped: dict[Stream, int] = {"stdout": 0, "stderr": 0}
        self._callback_tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        state = "running" if self._exit_code is None else f"exit {self._exit_code}"
        return f"<{type(self).__name__} pid={self.pid} {self.command!r} {state}>"

    # --- state ---

    @property
    def exit_code(self) -> int | None:
        """The exit code once the host saw the process end (wait(), info(), processes()); None
        before. 128+N when killed by signal N."""
        return self._exit_code

    @property
    def returncode(self) -> int | None:
        """The same as exit_code (the name asyncio.subprocess uses)."""
        return self._exit_code

    @property
    def stdout_dropped(self) -> int:
        """Bytes of stdout that the guest's buffer dropped before a reader of this handle got
        them (the most any one reader missed)."""
        return self._dropped["stdout"]

    @property
    def stderr_dropped(self) -> int:
        return self._dropped["stderr"]

    @property
    def stdout(self) -> ProcessOutput:
        """A new reader of stdout, from the oldest byte the guest still holds."""
        return ProcessOutput(self, "stdout")

    @property
    def stderr(self) -> ProcessOutput:
        """A new reader of stderr (always empty for a process with a terminal)."""
        return ProcessOutput(self, "stderr")

    # --- operations ---

    async def info(self) -> ProcessInfo:
        """What the guest knows of the process now."""
        return await self._wait_once(0)

    async def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code; TimeoutError after `timeout`
        seconds (the process goes on)."""
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise InputValidationError("timeout must be None or a number of seconds >= 0")
        if self._exit_code is not None:
            return self._exit_code
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = _HOLD_MS if deadline is None else int((deadline - loop.time()) * 1000)
            info = await self._wait_once(max(0, min(left, _HOLD_MS)))
            if info.exit_code is not None:
                return info.exit_code
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")

    async def write_stdin(self, data: bytes | str) -> None:
        """Write to the process's stdin (a str as UTF-8); returns once the guest wrote every
        byte into the pipe or terminal. BrokenPipeError once stdin is closed or the process
        has ended."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InputValidationError("data must be bytes or str")
        view = memoryview(data).cast("B")
        step = PROC["PROC_WRITE_MAX"]
        async with self._write_lock:  # one write per process at a time (protocol.h)
            for start in range(0, max(len(view), 1), step):
                await self._write(view[start : start + step], close=False)

    async def close_stdin(self) -> None:
        """Close the process's stdin (it reads end of file). Idempotent while it runs."""
        async with self._write_lock:
            try:
                await self._write(b"", close=True)
            except BrokenPipeError:
                pass  # closed already, or the process has ended

    async def kill(self, signal: int = _signal.SIGTERM) -> None:
        """Send `signal` (default SIGTERM) to the process's group. Nothing happens once it has
        ended."""
        sig = validate_signal(signal)
        try:
            await self._request(
                lambda vm, i, hold: vm.send_proc_signal(i, self.pid, sig), "pong", held=False
            )
        except ProcessLookupError:
            pass

    def send_signal(self, signal: int) -> Awaitable[None]:
        return self.kill(signal)

    async def terminate(self) -> None:
        await self.kill(_signal.SIGTERM)

    # --- internals (Session and the readers use them) ---

    def _start_callbacks(
        self, on_stdout: ProcessOutputCallback | None, on_stderr: ProcessOutputCallback | None
    ) -> None:
        for stream, callback in (("stdout", on_stdout), ("stderr", on_stderr)):
            if callback is not None:
                task = asyncio.get_running_loop().create_task(
                    self._pump(ProcessOutput(self, stream), callback)  # type: ignore[arg-type]
                )
                self._callback_tasks.append(task)
                task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._callback_tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("output callback of process %d ended: %r", self.pid, task.exception())

    async def _pump(self, reader: ProcessOutput, callback: ProcessOutputCallback) -> None:
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

    def _stop_callbacks(self) -> None:
        for task in list(self._callback_tasks):
            task.cancel()

    def _update(self, entry: ProcessEntry) -> ProcessInfo:
        info = _info(entry)
        if info.exit_code is not None:
            self._exit_code = info.exit_code
        return info

    def _count_dropped(self, stream: Stream, missed: int) -> None:
        # `missed`: all one reader's gaps so far (not the offset it jumped to: it had read the
        # bytes before its first gap).
        self._dropped[stream] = max(self._dropped[stream], missed)

    async def _request(
        self, send: Callable[[Any, int, int], int], expect: str, *, held: bool, hold_ms: int = 0
    ) -> Event:
        try:
            return await self._session._process_request(send, expect, held=held, hold_ms=hold_ms)
        except GuestRequestError as exc:
            if exc.code == PROC["ERR_NO_PROCESS"]:
                raise ProcessLookupError(
                    f"process {self.pid}: {exc.guest_message or 'no such process'}"
                ) from None
            raise

    async def _wait_once(self, wait_ms: int) -> ProcessInfo:
        event = await self._request(
            lambda vm, i, hold: vm.send_proc_wait(i, self.pid, hold),
            "proc_info",
            held=wait_ms > 0,
            hold_ms=wait_ms,
        )
        assert isinstance(event, ProcInfoEvent)
        entries = [e for e in event.processes if e.pid == self.pid]
        if len(event.processes) != 1 or not entries:
            raise ProcessError(f"the guest answered a wait for process {self.pid} with another")
        return self._update(entries[0])

    async def _write(self, chunk: bytes | memoryview, *, close: bool) -> None:
        try:
            await self._request(
                lambda vm, i, hold: vm.send_proc_write(i, self.pid, chunk, close_stdin=close),
                "pong",
                held=True,
            )
        except ProcessLookupError:
            raise BrokenPipeError(
                f"stdin of process {self.pid} is closed (or the process has ended)"
            ) from None

    async def _read(self, stream: Stream, offset: int) -> tuple[bytes, int, bool]:
        """One PROC_READ: (data, the offset of its first byte, end of stream)."""
        code = _STREAMS[stream]
        chunk = PROC["OUTPUT_CHUNK_MAX"]
        event = await self._request(
            lambda vm, i, hold: vm.send_proc_read(i, self.pid, code, offset, chunk, hold),
            "proc_data",
            held=True,
            hold_ms=_HOLD_MS,
        )
        assert isinstance(event, ProcDataEvent)
        # The guest may skip dropped bytes, never go back or send more than asked.
        if event.offset < offset or len(event.data) > chunk:
            raise ProcessError(f"the guest answered a read of process {self.pid} out of order")
        return event.data, event.offset, bool(event.flags & PROC["PROC_DATA_EOF"])


class Terminal(Process):
    """A process with a pseudo-terminal (`await session.terminal()`): job control, `isatty()`
    true, TERM=xterm-256color. Its output (stdout; stderr stays empty) is read with
    `async for chunk in terminal`, which goes on where the last loop stopped, as a screen does;
    `terminal.stdout` still gives a reader from the start. Keystrokes go in with write();
    close() hangs it up (SIGHUP, then SIGKILL if it lingers)."""

    def __init__(self, session: ProcessHost, pid: int, command: str, cols: int, rows: int) -> None:
        super().__init__(session, pid, command, pty=True)
        self.cols = cols
        self.rows = rows
        self._screen = ProcessOutput(self, "stdout")
        # The read in flight: a read() that times out leaves it running for the next one, so
        # that polling with short timeouts neither loses output nor piles up requests.
        self._next: asyncio.Future[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
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
            self._next = asyncio.ensure_future(self._next_chunk())
        done, _ = await asyncio.wait({self._next}, timeout=timeout)
        if not done:
            raise TimeoutError(f"no output from terminal {self.pid} within {timeout} s")
        chunk, self._next = self._next, None
        return chunk.result()

    async def _next_chunk(self) -> bytes:
        try:
            return await self._screen.__anext__()
        except StopAsyncIteration:
            return b""

    async def write(self, data: bytes | str) -> None:
        """Keystrokes (a str as UTF-8): "\\x03" is Ctrl-C, "\\x04" Ctrl-D, "\\r" Enter."""
        await self.write_stdin(data)

    async def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size; the program gets SIGWINCH."""
        cols, rows = validate_terminal_size(cols, rows)
        try:
            await self._request(
                lambda vm, i, hold: vm.send_proc_resize(i, self.pid, cols, rows),
                "pong",
                held=False,
            )
        except ProcessLookupError:
            return  # ended: nothing to resize
        self.cols, self.rows = cols, rows

    async def close(self, timeout: float = 5.0) -> int | None:
        """Hang up: SIGHUP to the terminal's process group, SIGKILL if it still runs after
        `timeout` seconds; returns its exit code (None if the session closed first)."""
        try:
            if self.exit_code is None:
                await self.kill(_signal.SIGHUP)
                try:
                    return await self.wait(timeout)
                except TimeoutError:
                    await self.kill(_signal.SIGKILL)
                    return await self.wait(timeout)
            return self.exit_code
        except SessionClosedError:
            return None
        finally:
            self._stop_callbacks()
            if self._next is not None and not self._next.done():
                self._next.cancel()

    async def __aenter__(self) -> Terminal:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
