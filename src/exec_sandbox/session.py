"""Session: one VM whose REPL keeps its state between exec() calls (see docs/design.md).

Resilience (API.md): exceptions, sys.exit(n), syntax errors, input validation and output limits
keep the session and its state; a timeout or a signal other than SIGKILL resets the REPL in the
guest (state lost, session alive); exit 137, a dead VM or a lost channel close the session, and
the next call raises SessionClosedError.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from . import files, limits
from ._vm import (
    EXIT_SIGKILL,
    EXIT_STDERR_LIMIT,
    EXIT_STDOUT_LIMIT,
    OOM_NOTE,
    ExecRequest,
    GuestVm,
    OutputCallback,
)
from .errors import (
    CommunicationError,
    InputValidationError,
    OutputLimitError,
    SessionClosedError,
    VmTransientError,
)
from .models import ExecutionResult, FileInfo, Language, PackagesReport, TimingBreakdown
from .validation import validate_code, validate_env, validate_timeout

log = logging.getLogger("exec_sandbox")
_T = TypeVar("_T")

_NOOP: dict[Language, bytes] = {"python": b"pass", "javascript": b"undefined", "raw": b":"}


class Session:
    """A live VM with a persistent REPL. Create with `await scheduler.session(...)`.

    All operations on one session run one at a time, in call order. Any activity resets the idle
    timer; a session idle for `session_idle_timeout_seconds` closes itself.
    """

    def __init__(
        self,
        vm: GuestVm,
        *,
        language: Language,
        default_timeout_seconds: float,
        default_env: Mapping[str, str] | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        idle_timeout_seconds: float,
        on_close: Callable[[Session], None],
        boot_ms: int = 0,
        warm_pool_hit: bool = False,
        l1_cache_hit: bool = False,
        packages: PackagesReport | None = None,
    ) -> None:
        self.session_id = uuid.uuid4().hex
        # Which speed tier gave this session its VM (like ExecutionResult's fields for run()).
        self.warm_pool_hit = warm_pool_hit
        self.l1_cache_hit = l1_cache_hit
        # The packages installed in its VM (None: none), as ExecutionResult.packages.
        self.packages = packages
        self.language = language
        self._vm = vm
        self._default_timeout = default_timeout_seconds
        self._default_env = dict(default_env or {})
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._idle_timeout = idle_timeout_seconds
        self._on_close = on_close
        self._boot_ms = boot_ms
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._busy = 0
        self._closed = False
        self._close_reason = ""
        self.exec_count = 0
        self._touch()

    async def start_repl(self) -> None:
        """Start the guest REPL now, so that the interpreter's start-up (seconds for node under
        TCG) is part of opening the session and not of the first exec()'s timeout."""
        outcome = await self._vm.execute(
            ExecRequest(
                language=self.language,
                code=_NOOP[self.language],
                timeout_ms=int(limits.BOOT_TIMEOUT_SECONDS * 1000),
                env=[],
                stdout_limit=limits.STDOUT_LIMIT_BYTES,
                stderr_limit=limits.STDERR_LIMIT_BYTES,
                session=True,
            )
        )
        if outcome.exit_code != 0:
            raise VmTransientError(
                f"the {self.language} REPL did not start (exit {outcome.exit_code}): "
                f"{outcome.stderr[-500:]}"
            )

    # --- public API ---

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:  # fmt: skip
        await self.close()

    async def close(self) -> None:
        """Destroy the VM; returns once QEMU is reaped and its cgroup removed. Idempotent."""
        self._close_now("closed by the caller")
        await self._vm.aclose()

    async def exec(
        self,
        code: str,
        *,
        timeout_seconds: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run code in the session's REPL; state persists between calls."""
        started = time.monotonic()
        code_bytes = validate_code(code)
        timeout = self._default_timeout if timeout_seconds is None else timeout_seconds
        timeout_ms = validate_timeout(timeout)
        env = validate_env({**self._default_env, **(env_vars or {})})
        request = ExecRequest(
            language=self.language,
            code=code_bytes,
            timeout_ms=timeout_ms,
            env=env,
            stdout_limit=limits.STDOUT_LIMIT_BYTES,
            stderr_limit=limits.STDERR_LIMIT_BYTES,
            on_stdout=on_stdout if on_stdout is not None else self._on_stdout,
            on_stderr=on_stderr if on_stderr is not None else self._on_stderr,
            session=True,
        )

        async def run() -> ExecutionResult:
            dispatched = time.monotonic()
            outcome = await self._vm.execute(request)
            done = time.monotonic()
            self.exec_count += 1
            if not self._vm.alive:
                self._close_now("the VM stopped during exec()")
            elif outcome.exit_code == EXIT_SIGKILL:
                # The guest ran out of memory or the code killed its own REPL for good. API.md:
                # the session ends.
                self._close_now("the REPL was killed by SIGKILL (exit 137), most likely by the "
                                "guest's OOM killer")
            if outcome.flags & EXIT_STDOUT_LIMIT:
                raise OutputLimitError(f"stdout exceeded {limits.STDOUT_LIMIT_BYTES} bytes",
                                      stdout=outcome.stdout, stderr=outcome.stderr)
            if outcome.flags & EXIT_STDERR_LIMIT:
                raise OutputLimitError(f"stderr exceeded {limits.STDERR_LIMIT_BYTES} bytes",
                                      stdout=outcome.stdout, stderr=outcome.stderr)
            stderr = outcome.stderr
            if outcome.exit_code == -1:
                stderr += (
                    f"\nExecution timed out after {timeout} seconds; the REPL was reset "
                    "(its state is lost)\n"
                )
            elif outcome.exit_code == EXIT_SIGKILL:
                stderr += OOM_NOTE + "The session is closed (the REPL and its state are gone).\n"
            return ExecutionResult(
                stdout=outcome.stdout,
                stderr=stderr,
                exit_code=outcome.exit_code,
                execution_time_ms=outcome.duration_us // 1000,
                timing=TimingBreakdown(
                    setup_ms=_ms(dispatched - started),
                    boot_ms=0,
                    execute_ms=_ms(done - dispatched),
                    total_ms=_ms(time.monotonic() - started),
                ),
            )

        return await self._serialised(run)

    async def write_file(self, path: str, content: files.Content, *,
                         make_executable: bool = False) -> None:  # fmt: skip
        """Write content (bytes, a Path or a binary file object) to path under /home/user.
        Atomic: the file appears whole or not at all. Missing directories are created."""
        relative = files.guest_path(path)
        if not isinstance(content, (bytes, bytearray, memoryview, Path)) and not hasattr(
            content, "read"
        ):
            raise InputValidationError(
                f"content must be bytes, a Path or a binary file object, got "
                f"{type(content).__name__}"
            )

        async def run() -> None:
            await files.write_file(self._vm, relative, content, make_executable)

        await self._serialised(run)

    async def read_file(self, path: str, *,
                        destination: files.Destination | None = None) -> bytes | None:  # fmt: skip
        """The file's bytes, or None once written to destination (a Path or binary file)."""
        relative = files.guest_path(path)

        async def run() -> bytes | None:
            return await files.read_file(self._vm, relative, destination)

        return await self._serialised(run)

    async def list_files(self, path: str = "") -> list[FileInfo]:
        """Entries of a directory under /home/user ("" = the home itself), sorted by name."""
        relative = files.guest_path(path, allow_empty=True)

        async def run() -> list[FileInfo]:
            return await files.list_files(self._vm, relative)

        return await self._serialised(run)

    # --- internals ---

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"session {self.session_id} is closed: {self._close_reason}")

    async def _serialised(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        self._check_open()
        self._busy += 1
        try:
            async with self._lock:
                self._check_open()
                try:
                    return await operation()
                except (CommunicationError, VmTransientError) as exc:
                    if not self._vm.alive:
                        self._close_now(f"the VM failed: {exc}")
                    raise
        finally:
            self._busy -= 1
            self._touch()

    def _touch(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if not self._closed:
            self._idle_timer = self._loop.call_later(self._idle_timeout, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_timer = None
        if self._busy:
            self._touch()  # an exec longer than the idle timeout is activity
            return
        log.info("session %s idle for %.0f s: closing it", self.session_id, self._idle_timeout)
        self._close_now(f"idle for {self._idle_timeout:.0f} s")

    def _close_now(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._vm.close()
        self._on_close(self)


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))

