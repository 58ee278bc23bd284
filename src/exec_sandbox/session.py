"""Session: one VM whose REPL keeps its state between exec() calls (see docs/design.md).

Resilience (the public contract): exceptions, sys.exit(n), syntax errors, input validation and
output limits keep the session and its state; a timeout or a signal other than SIGKILL resets
the REPL in the guest (state lost, session alive); exit 137, a dead VM or a lost channel close
the session, and the next call raises SessionClosedError.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from . import limits
from . import processes as _processes
from ._futures import retrieve
from .errors import (
    CommunicationError,
    InputValidationError,
    PackageNotAllowedError,
    SessionClosedError,
    VmTransientError,
)
from .host_tools import HostTools
from .installs import InstallService, runtime_to_meta
from .models import (
    ExecutionResult,
    ExposedPort,
    FileInfo,
    Language,
    NetworkConnection,
    PackagesReport,
    SessionSnapshot,
    TimingBreakdown,
)
from .processes import Process, ProcessOutputCallback, Terminal
from .provisioning.lease import Lease
from .results import EXIT_SIGKILL, shape_result
from .validation import validate_code, validate_env, validate_timeout
from .vm import file_transfer
from .vm.execution import ExecRequest, OutputCallback
from .vm.guest import GuestRequestError, GuestVm

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .vm.binding import Event

log = logging.getLogger("exec_sandbox")
_T = TypeVar("_T")

_MAX_FORKS = 16
_NO_OP = {"python": "pass", "javascript": "undefined", "raw": "true"}
_SETTLE_SECONDS = 10
_NOOP: dict[Language, bytes] = {"python": b"pass", "javascript": b"undefined", "raw": b":"}


class Session:
    """A live VM with a persistent REPL. Create with `await scheduler.session(...)`.

    All operations on one session run one at a time, in call order. Any activity resets the idle
    timer; a session idle for `session_idle_timeout_seconds` closes itself.
    """

    # Resolved when the session closes: process operations in flight fail then (_process_request).
    _closing: asyncio.Future[None] | None = None
    # Handles of the session's processes by pid (processes.py), and the held-request slots.
    _process_handles: dict[int, Process] | None = None
    _held_slots: asyncio.Semaphore | None = None

    def __init__(
        self,
        lease: Lease[GuestVm],
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
        tools: HostTools | None = None,
        hooks: SessionHooks | None = None,
        exec_count: int = 0,
        installs: InstallService | None = None,
    ) -> None:
        self.session_id = uuid.uuid4().hex
        # Which speed tier gave this session its VM (like ExecutionResult's fields for run()).
        self.warm_pool_hit = warm_pool_hit
        self.l1_cache_hit = l1_cache_hit
        # The packages installed in its VM (None: none), as ExecutionResult.packages.
        self.packages = packages
        # What `pip install` in the VM and install() added (None: this host serves none).
        self._installs = installs
        self.language = language
        # The VM and its admission ticket: the session owns both until it closes.
        self._lease = lease
        self._vm = lease.vm
        self._default_timeout = default_timeout_seconds
        self._default_env = dict(default_env or {})
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        # What the code may call on the host (tools={...}); every exec() offers the same.
        self.tools = tools
        self._idle_timeout = idle_timeout_seconds
        self._on_close = on_close
        self._boot_ms = boot_ms
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._busy = 0
        self._closed = False
        self._close_reason = ""
        self.exec_count = exec_count
        self._hooks = hooks
        self._idle_pause: asyncio.Future[None] | None = None
        # The snapshot an idle pause made (session_idle_action="pause"), else None.
        self.paused_as: SessionSnapshot | None = None
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
    def close_reason(self) -> str:
        """Why the session closed ("" while it is open): closed by the caller, paused, idle for
        its timeout, its VM failed, its REPL was killed."""
        return self._close_reason

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Destroy the VM; returns once QEMU is reaped and its cgroup removed. Idempotent."""
        if self._idle_pause is not None and not self._idle_pause.done():
            self._idle_pause.cancel()  # a pause being saved: the VM ends instead
        await self._settle_volumes()
        self._close_now("closed by the caller")
        await self._lease.release()

    async def _settle_volumes(self) -> None:
        """The guest makes read-write volumes durable before each exec's EXIT only, so what a
        spawned process or a terminal wrote since the last exec would die with the VM (ext4
        commits every 5 s): an empty exec settles them first. Skipped while an exec runs (close
        does not wait for it) and bounded: a guest that does not answer is closed anyway."""
        claims = self._vm.spec.volumes
        if self._closed or claims is None or not claims.read_write or self._lock.locked():
            return
        if not self._vm.alive:
            return
        try:
            await asyncio.wait_for(
                self.exec(_NO_OP[self.language], timeout_seconds=_SETTLE_SECONDS),
                _SETTLE_SECONDS + 5,
            )
        except Exception as exc:  # the VM is destroyed next either way
            log.warning(
                "session %s: settling its volumes before close failed: %s", self.session_id, exc
            )

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
            tools=self.tools,
            installer=self._installer(),
        )

        async def run() -> ExecutionResult:
            dispatched = time.monotonic()
            log_since = time.time()
            outcome = await self._vm.execute(request)
            done = time.monotonic()
            self.exec_count += 1
            if not self._vm.alive:
                self._close_now("the VM stopped during exec()")
            elif outcome.exit_code == EXIT_SIGKILL:
                # The guest ran out of memory or the code killed its own REPL for good. By contract,
                # the session ends.
                self._close_now(
                    "the REPL was killed by SIGKILL (exit 137), most likely by the "
                    "guest's OOM killer"
                )
            return shape_result(
                outcome,
                timeout_seconds=timeout,
                in_session=True,
                timing=TimingBreakdown(
                    setup_ms=_ms(dispatched - started),
                    boot_ms=0,
                    execute_ms=_ms(done - dispatched),
                    total_ms=_ms(time.monotonic() - started),
                ),
                exposed_ports=self.exposed_ports,
                network_log=[c for c in self.network_log if c.started_at >= log_since],
            )

        return await self._serialised(run)

    @property
    def exposed_ports(self) -> list[ExposedPort]:
        """The guest ports reachable from the host (expose_ports), while the session is open."""
        network = self._vm.network
        return [] if network is None or self.closed else list(network.exposed)

    @property
    def network_log(self) -> list[NetworkConnection]:
        """Every connection of the session so far, allowed or refused (oldest first)."""
        network = self._vm.network
        return [] if network is None else network.log

    async def write_file(
        self, path: str, content: file_transfer.Content, *, make_executable: bool = False
    ) -> None:
        """Write content (bytes, a Path or a binary file object) to path under /home/user.
        Atomic: the file appears whole or not at all. Missing directories are created."""
        relative = file_transfer.guest_path(path)
        if not isinstance(content, (bytes, bytearray, memoryview, Path)) and not hasattr(
            content, "read"
        ):
            raise InputValidationError(
                f"content must be bytes, a Path or a binary file object, got "
                f"{type(content).__name__}"
            )

        async def run() -> None:
            await file_transfer.write_file(self._vm, relative, content, make_executable)

        await self._serialised(run)

    async def read_file(
        self, path: str, *, destination: file_transfer.Destination | None = None
    ) -> bytes | None:
        """The file's bytes, or None once written to destination (a Path or binary file)."""
        relative = file_transfer.guest_path(path)

        async def run() -> bytes | None:
            return await file_transfer.read_file(self._vm, relative, destination)

        return await self._serialised(run)

    async def list_files(self, path: str = "") -> list[FileInfo]:
        """Entries of a directory under /home/user ("" = the home itself), sorted by name."""
        relative = file_transfer.guest_path(path, allow_empty=True)

        async def run() -> list[FileInfo]:
            return await file_transfer.list_files(self._vm, relative)

        return await self._serialised(run)

    async def pause(self) -> SessionSnapshot:
        """Save the whole live state (the REPL and its variables, files under /home/user, cwd,
        env) to disk and close the session: its VM and admission slot are freed, and
        `Scheduler.resume(str(snapshot))` gives it back, also in another process. A pause
        requested while an exec() runs waits for it to end (calls run one at a time)."""
        hooks = self._require_hooks()

        async def run() -> SessionSnapshot:
            try:
                snapshot = await hooks.pause(self)
            except BaseException:
                if not self._vm.alive:
                    self._close_now("the VM ended while it was being paused")
                raise
            self._close_now(f"paused as snapshot {snapshot.id}")
            return snapshot

        return await self._serialised(run)

    async def fork(self, count: int | None = None) -> Session | list[Session]:
        """Live copies of this session, running independently from now on: `fork()` gives
        one Session, `fork(n)` a list of n. Copies share the unchanged memory pages
        copy-on-write; each gets a fresh kernel RNG and the host's clock, but everything in
        user space is copied as it is (Python's `random` state and hash seed included: a fork
        is a copy). This session pauses for the save and then runs on."""
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_FORKS
        ):
            raise InputValidationError(f"count must be an integer from 1 to {_MAX_FORKS}")
        hooks = self._require_hooks()

        async def run() -> list[Session]:
            try:
                return await hooks.fork(self, count or 1)
            except BaseException:
                if not self._vm.alive:
                    self._close_now("the VM ended while it was being forked")
                raise

        forks = await self._serialised(run)
        return forks if count is not None else forks[0]

    # --- background processes and terminals (processes.py) ---

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: ProcessOutputCallback | None = None,
        on_stderr: ProcessOutputCallback | None = None,
    ) -> Process:
        """Start a process in the session's VM beside its executions and return its handle
        once it is executing. `cmd`: a str runs through the image's shell (`sh -c`), a list is
        the argv (argv[0] looked up in PATH). It runs as the code of exec() does (same user,
        limits and image; the session's env_vars plus `env`; `cwd` or the working directory
        code gets) and goes on until it ends or is killed: exec() calls, pause/resume and
        fork keep it. Callbacks get its output as bytes (sync or async functions)."""
        argv = _processes.validate_argv(cmd)
        cwd_bytes = _processes.validate_cwd(cwd)
        env_list = _processes.spawn_env(self._default_env, env)
        for name, callback in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
            if callback is not None and not callable(callback):
                raise InputValidationError(f"{name} must be callable")
        process: Process = await self._spawn(argv, cwd_bytes, env_list, None)
        process._start_callbacks(on_stdout, on_stderr)
        return process

    async def terminal(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        cmd: str | Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Terminal:
        """A process with a pseudo-terminal of cols x rows (1..1000 each): the image's bash as
        a login, interactive shell (its sh without bash), or `cmd`; TERM=xterm-256color. Use it
        as an async context manager, or close() it."""
        cols, rows = _processes.validate_terminal_size(cols, rows)
        argv = _processes.validate_argv(_processes.TERMINAL_SHELL if cmd is None else cmd)
        cwd_bytes = _processes.validate_cwd(cwd)
        env_list = _processes.spawn_env({**self._default_env, **_processes.TERMINAL_ENV}, env)
        terminal = await self._spawn(argv, cwd_bytes, env_list, (cols, rows))
        assert isinstance(terminal, Terminal)
        return terminal

    async def processes(self) -> list[Process]:
        """Every process the guest tracks (running, or ended with its record still kept),
        oldest first: the handles spawn() gave, and new ones for processes started before a
        pause or a fork, or by another host process."""

        async def run() -> list[Process]:
            event = await self._process_request(
                lambda vm, i, hold: vm.send_proc_list(i), "proc_info", held=False
            )
            listed = [self._process_handle(entry) for entry in event.processes]  # type: ignore[union-attr]
            # The guest dropped the records of the others: so does this session's table.
            self._process_handles = {p.pid: p for p in listed}
            return listed

        # Beside exec() and the file calls, not after them: a server is started or listed while
        # a long exec (a test suite) runs.
        return await run()

    async def _spawn(
        self,
        argv: list[bytes],
        cwd: bytes,
        env: list[tuple[bytes, bytes]],
        size: tuple[int, int] | None,
    ) -> Any:
        async def run() -> Process:
            cols, rows = size or (0, 0)
            try:
                event = await self._process_request(
                    lambda vm, i, hold: vm.send_proc_spawn(
                        i, argv, cwd, env, pty=size is not None, cols=cols, rows=rows
                    ),
                    "proc_info",
                    held=False,
                    timeout=60.0,
                )
            except GuestRequestError as exc:
                # The guest names the step ("chdir: No such file or directory"), not the path.
                where = f" in {cwd.decode(errors='replace')}" if cwd else ""
                raise _processes.ProcessError(
                    f"cannot start {argv[0].decode(errors='replace')}{where}: {exc.guest_message}"
                ) from None
            entries = event.processes  # type: ignore[union-attr]
            if len(entries) != 1:
                raise _processes.ProcessError(
                    "the guest answered a spawn with another number of processes"
                )
            return self._process_handle(entries[0], size)

        process: Process = await run()  # beside exec(), as processes()
        return process

    def _process_handle(self, entry: Any, size: tuple[int, int] | None = None) -> Process:
        """The handle of the process entry describes: the one this session made for its pid
        (unless the guest reused the pid for a new process), else a new one."""
        if self._process_handles is None:
            self._process_handles = {}
        handle = self._process_handles.get(entry.pid)
        if handle is None or handle.command != entry.command or size is not None:
            pty = bool(entry.flags & _processes.PTY_FLAG)
            if pty:
                cols, rows = size or (80, 24)
                handle = Terminal(self, entry.pid, entry.command, cols, rows)
            else:
                handle = Process(self, entry.pid, entry.command, False)
            self._process_handles[entry.pid] = handle
            if len(self._process_handles) > 2 * _processes.PROC_TRACKED_MAX:
                # Spawned and never listed: the ended ones go (the guest keeps at most
                # PROC_TRACKED_MAX records, so the table stays bounded as well).
                self._process_handles = {
                    pid: p for pid, p in self._process_handles.items() if p.exit_code is None
                }
        handle._update(entry)
        return handle

    async def _process_request(
        self,
        send: Callable[[Any, int, int], int],
        expect: str,
        *,
        held: bool,
        hold_ms: int = 0,
        timeout: float | None = 30.0,
    ) -> Event:
        """One process request to the guest (processes.py), outside the lock that orders
        exec() and the file calls: a reader runs beside an exec. `send(vm, id, hold_ms)`.
        While it waits the session counts as busy (a host reader keeps it from idling); once
        the session closes it fails with SessionClosedError at once. Held requests (the guest
        keeps a PROC_READ / PROC_WAIT up to hold_ms, a PROC_WRITE until written) take one of
        the slots that keep the host under the guest's limit; without a free one, a read or
        wait polls instead."""
        self._check_open()
        if self._held_slots is None:
            self._held_slots = asyncio.Semaphore(_processes.HELD_MAX)
        if self._closing is None:
            self._closing = self._loop.create_future()
        slots = self._held_slots
        self._busy += 1
        try:
            while True:
                hold = hold_ms
                slot = False
                if held and (hold == 0 or not slots.locked()):
                    await slots.acquire()
                    slot = True
                elif held:
                    hold = 0  # every slot taken: poll
                    await asyncio.sleep(_processes.POLL_SECONDS)
                    self._check_open()
                wait = (
                    timeout
                    if not held or hold == 0
                    else hold / 1000 + _processes.REPLY_GRACE_SECONDS
                )
                if held and hold_ms == 0:
                    wait = None  # a write waits until the process has read it
                request: asyncio.Future[Any] = asyncio.ensure_future(
                    self._vm.proc_request(
                        functools.partial(_with_hold, send, hold), expect, wait or 1e9
                    )
                )
                # Cancelled below when the caller or the session goes: its late error (the VM
                # closed meanwhile) is nobody's.
                request.add_done_callback(retrieve)
                closing: asyncio.Future[Any] = self._closing
                try:
                    await asyncio.wait({request, closing}, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    request.cancel()  # the caller gave up: nobody is left to take the answer
                    raise
                finally:
                    if slot:
                        slots.release()
                if not request.done():
                    request.cancel()
                    self._check_open()
                try:
                    event: Event = request.result()
                    return event
                except GuestRequestError as exc:
                    if exc.code == _processes.ERR_LIMIT and held:
                        # The guest's slots, a read's, a wait's or a write's alike: they free up
                        # (a held read or wait within its hold, also one the caller cancelled
                        # here, which the guest still holds): retry.
                        await asyncio.sleep(_processes.POLL_SECONDS)
                        self._check_open()
                        continue
                    if exc.code == _processes.ERR_LIMIT:
                        raise _processes.ProcessError(
                            f"the sandbox refused: {exc.guest_message}"
                        ) from None
                    raise
                except (CommunicationError, VmTransientError) as exc:
                    if not self._vm.alive:
                        self._close_now(f"the VM failed: {exc}")
                    self._check_open()
                    raise
        finally:
            self._busy -= 1
            self._touch()

    @property
    def vm(self) -> GuestVm:
        """The session's VM (for the scheduler that owns it)."""
        return self._vm

    @property
    def default_timeout(self) -> float:
        return self._default_timeout

    @property
    def default_env(self) -> dict[str, str]:
        return dict(self._default_env)

    def settings(self) -> dict[str, object]:
        """What a paused copy of this session needs besides its VM (its meta.json)."""
        return {
            "timeout": self.default_timeout,
            "env": self.default_env,
            "exec_count": self.exec_count,
            "installed": runtime_to_meta(self._installs.runtime if self._installs else ()),
        }

    @property
    def installs(self) -> InstallService | None:
        return self._installs

    @property
    def installed(self) -> tuple[str, ...]:
        """Every package the VM has: its packages= layer, then what installs added
        ("name==version", dependencies included)."""
        boot = () if self.packages is None else self.packages.packages
        return (*boot, *(self._installs.packages if self._installs else ()))

    async def install(
        self, packages: Sequence[str], *, timeout_seconds: float | None = None
    ) -> PackagesReport:
        """Install packages into the running session, as `pip install` (python and raw
        sessions) or `npm install` (javascript sessions) in its code would: built on the host
        (wheels only / no install scripts, the host's index), importable by the next exec() (a
        python REPL at once). Exact pins (`six==1.16.0`, `left-pad@1.3.0`) or bare names (the
        newest, recorded exactly); ranges with enable_package_validation=False. Returns what
        this call added. Raises PackageNotAllowedError when the tool or the sandbox refuses,
        with the tool's error lines."""
        from .packages.specs import validate_packages

        if self._installs is None:
            raise PackageNotAllowedError("this session's host serves no installs")
        kind: Language = "javascript" if self.language == "javascript" else "python"
        specs = validate_packages(packages, kind, strict=self._installs.strict, bare=True)
        if not specs:
            raise InputValidationError("install() needs at least one package")
        before = len(self._installs.runtime)
        # Run by the session's own REPL (a separate execution would end it): the guest's pip
        # unpacks what the host sends, and a python REPL can import it at once.
        tool = "npm" if kind == "javascript" else "pip"
        argv = ["install", *(["-q"] if tool == "pip" else []), *(s.requirement for s in specs)]
        timeout = self._default_timeout if timeout_seconds is None else timeout_seconds
        request = ExecRequest(
            language=self.language,
            code=_install_code(self.language, tool, argv),
            timeout_ms=validate_timeout(timeout),
            env=[],
            stdout_limit=limits.STDOUT_LIMIT_BYTES,
            stderr_limit=limits.STDERR_LIMIT_BYTES,
            session=True,
            installer=self._installer(),
        )

        async def run() -> PackagesReport:
            outcome = await self._vm.execute(request)
            if outcome.exit_code != 0:
                lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
                raise PackageNotAllowedError("\n".join(lines[-20:]) or "the install failed")
            assert self._installs is not None
            added = self._installs.runtime[before:]
            return PackagesReport(
                packages=tuple(p for layer in added for p in layer.packages),
                cache_hit=self._installs.last_cache_hit,
                resolved=not self._installs.last_cache_hit,
                size_bytes=sum(layer.size for layer in added),
            )

        return await self._serialised(run)

    # --- internals ---

    def _installer(self) -> Callable[[bytes], Awaitable[bytes]] | None:
        if self._installs is None:
            return None
        return functools.partial(self._installs.serve, self._vm)

    def _require_hooks(self) -> SessionHooks:
        if self._hooks is None:
            raise SessionClosedError(
                "this session was not opened by a Scheduler: it cannot be paused or forked"
            )
        return self._hooks

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
        if self._hooks is not None and self._hooks.pause_when_idle:
            self._idle_pause = asyncio.ensure_future(self._pause_idle())
            return
        log.info("session %s idle for %.0f s: closing it", self.session_id, self._idle_timeout)
        self._close_now(f"idle for {self._idle_timeout:.0f} s")

    async def _pause_idle(self) -> None:
        """session_idle_action="pause": the idle session is paused instead of closed (its
        snapshot id is logged and listed by Scheduler.snapshots()); closed if that fails."""
        try:
            snapshot = await self.pause()
            log.info(
                "session %s idle for %.0f s: paused as %s",
                self.session_id,
                self._idle_timeout,
                snapshot.id,
            )
            self.paused_as = snapshot
        except Exception as exc:
            log.warning("session %s idle: pausing failed (%s), closing it", self.session_id, exc)
            self._close_now(f"idle for {self._idle_timeout:.0f} s (pausing failed: {exc})")

    def _close_now(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        if self._closing is not None and not self._closing.done():
            self._closing.set_result(None)  # process operations in flight fail now
        for handle in (self._process_handles or {}).values():
            handle._stop_callbacks()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._lease.discard()
        self._on_close(self)


@dataclass(frozen=True)
class SessionHooks:
    """What the scheduler does for a session's pause() and fork() (it owns admission and the
    snapshot store)."""

    pause: Callable[[Session], Awaitable[SessionSnapshot]]
    fork: Callable[[Session, int], Awaitable[list[Session]]]
    pause_when_idle: bool = False


def _install_code(language: Language, tool: str, argv: list[str]) -> bytes:
    """Code that runs the guest's pip or npm with argv in a REPL of language, leaving no name
    behind and failing (non-zero exit or an exception) when the tool does. argv holds validated
    package specifiers only (packages/specs.py: no quotes, spaces or shell characters)."""
    if language == "python":
        return (
            '__import__("sys").exit(__import__("exec_sandbox_guest._install", '
            f'fromlist=["main"]).main({argv!r}))'
        ).encode()
    if language == "raw":
        return (tool + " " + " ".join(shlex.quote(a) for a in argv)).encode()
    return (
        "{ const r = require('child_process').spawnSync("
        + json.dumps(tool)
        + ", "
        + json.dumps(argv)
        + ", { encoding: 'utf8' }); process.stdout.write(r.stdout || ''); "
        "process.stderr.write(r.stderr || ''); "
        "if (r.status !== 0) throw new Error(" + json.dumps(tool + " install failed") + "); }"
    ).encode()


def _with_hold(send: Callable[[Any, int, int], int], hold: int, vm: Any, req_id: int) -> int:
    return send(vm, req_id, hold)


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
