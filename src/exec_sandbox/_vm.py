"""The asyncio face of one QEMU microVM: the only module that imports the C extension.

The C `Vm` owns the QEMU process and three file descriptors: the agent channel (a socket whose
bytes are decoded into events in C), the guest console (boot log, QEMU's own errors) and a pidfd
that becomes readable when QEMU exits. This module registers those fds with the running loop
(`add_reader`), so that nothing here ever blocks the loop, and turns events into futures.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _execsbx
from .errors import (
    CommunicationOutcomeUnknownError,
    GuestAgentError,
    VmPermanentError,
    VmTimeoutError,
    VmTransientError,
)
from .images import GuestImages
from .jail import report_layers
from .models import Language

log = logging.getLogger("exec_sandbox")

LANGUAGE_CODES: dict[Language, int] = {
    "python": _execsbx.LANG_PYTHON,
    "javascript": _execsbx.LANG_JAVASCRIPT,
    "raw": _execsbx.LANG_RAW,
}
EXIT_TIMED_OUT = _execsbx.EXIT_TIMED_OUT
EXIT_STDOUT_LIMIT = _execsbx.EXIT_STDOUT_LIMIT
EXIT_STDERR_LIMIT = _execsbx.EXIT_STDERR_LIMIT
_CONSOLE_TAIL_BYTES = 16 * 1024

OutputCallback = Callable[[str], None]


def measure_tsc_khz() -> int:
    return int(_execsbx.tsc_khz())


@dataclass(frozen=True)
class VmSpec:
    """Everything that decides how one VM is started."""

    qemu_binary: str
    images: GuestImages
    accel: str
    memory_mb: int
    vcpus: int = 1
    kernel_cmdline_extra: str = ""
    # The host jail (jail.py, src/_execsbx/jail.c): None runs QEMU without it.
    jail: dict[str, int] | None = None
    qemu_sandbox: bool = False


@dataclass
class ExecRequest:
    language: Language
    code: bytes
    timeout_ms: int
    env: list[tuple[bytes, bytes]]
    stdout_limit: int
    stderr_limit: int
    on_stdout: OutputCallback | None = None
    on_stderr: OutputCallback | None = None
    session: bool = False  # run in the VM's persistent REPL (SESSION_EXEC)


@dataclass
class ExecOutcome:
    stdout: str
    stderr: str
    exit_code: int
    flags: int
    duration_us: int


class _OutputStream:
    """One of stdout/stderr of a running execution: decodes UTF-8 incrementally, so that chunks
    split inside a character reach the callback whole, and keeps the text for the result."""

    def __init__(self, name: str, callback: OutputCallback | None) -> None:
        self.name = name
        self._callback = callback
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        self.byte_count = 0

    def feed(self, data: bytes, final: bool = False) -> None:
        self.byte_count += len(data)
        text = self._decoder.decode(data, final)
        if not text:
            return
        self._parts.append(text)
        if self._callback is not None:
            try:
                self._callback(text)
            except Exception as exc:  # a user callback must not break the execution
                warnings.warn(
                    f"on_{self.name} callback raised {exc!r}; it is disabled for this execution",
                    RuntimeWarning,
                    stacklevel=1,
                )
                self._callback = None

    def text(self) -> str:
        self.feed(b"", final=True)
        return "".join(self._parts)


class GuestFileError(Exception):
    """The guest refused or failed a file transfer (FILE_ERROR); `kind` is a FILE_ERR_* code."""

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class FileTransfer:
    """One file request in flight: FILE_DATA / FILE_ENTRIES go to the callbacks, FILE_DONE or
    FILE_ERROR settles `done` (with the count, or a GuestFileError)."""

    id: int
    done: asyncio.Future[int]
    on_data: Callable[[bytes], None] | None = None
    on_entries: Callable[[list[tuple[bytes, bool, int]]], None] | None = None


@dataclass
class _Execution:
    stdout: _OutputStream
    stderr: _OutputStream
    done: asyncio.Future[tuple[int, int, int]]
    limits: tuple[int, int] = (0, 0)
    extra: dict[str, Any] = field(default_factory=dict)


class GuestVm:
    """A booted VM whose guest agent has said READY. Create with `await GuestVm.boot(...)`."""

    def __init__(self, vm: Any, loop: asyncio.AbstractEventLoop,
                 on_boot_log: OutputCallback | None) -> None:  # fmt: skip
        self._vm = vm
        self._loop = loop
        self._on_boot_log = on_boot_log
        self._console_tail = bytearray()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._runs: dict[int, _Execution] = {}
        self._transfers: dict[int, FileTransfer] = {}
        self._flushed: list[asyncio.Future[None]] = []
        self._next_id = 1
        self._broken: BaseException | None = None
        self._writing = False
        self.pid: int = vm.pid
        loop.add_reader(vm.channel_fd, self._on_channel)
        loop.add_reader(vm.console_fd, self._on_console)
        loop.add_reader(vm.pidfd, self._on_qemu_exit)

    @classmethod
    async def boot(cls, spec: VmSpec, *, boot_timeout: float,
                   on_boot_log: OutputCallback | None = None) -> GuestVm:  # fmt: skip
        """Start QEMU and wait until the guest agent is ready. Raises VmTimeoutError or
        VmTransientError (with the console's last lines) if it is not; the VM is gone then."""
        loop = asyncio.get_running_loop()
        try:
            vm = _execsbx.Vm(
                qemu_binary=spec.qemu_binary,
                kernel=str(spec.images.kernel),
                rootfs=str(spec.images.rootfs),
                memory_mb=spec.memory_mb,
                vcpus=spec.vcpus,
                accel=spec.accel,
                kernel_cmdline_extra=spec.kernel_cmdline_extra,
                qemu_sandbox=spec.qemu_sandbox,
                jail=spec.jail,
            )
        except FileNotFoundError as exc:
            raise VmPermanentError(f"cannot start QEMU: {exc}") from exc
        except OSError as exc:
            raise VmTransientError(f"cannot start QEMU: {exc}") from exc
        report_layers(vm.jail_status())
        guest = cls(vm, loop, on_boot_log)
        try:
            await asyncio.wait_for(asyncio.shield(guest._ready), boot_timeout)
        except asyncio.TimeoutError:
            guest.close()
            raise VmTimeoutError(
                f"guest did not become ready within {boot_timeout:.0f} s{guest._console_hint()}"
            ) from None
        except BaseException:
            guest.close()
            raise
        return guest

    @property
    def alive(self) -> bool:
        return self._broken is None and not self._vm.closed

    @property
    def jail_status(self) -> list[tuple[str, bool, str]]:
        """(layer, active, detail) of the host jail around this VM's QEMU."""
        return list(self._vm.jail_status())

    def resource_usage(self) -> tuple[int | None, int | None] | None:
        """(cpu_ns, memory_peak_bytes) of QEMU from its cgroup, once closed; else None."""
        usage = self._vm.resource_usage()
        return None if usage is None else (usage[0], usage[1])

    @property
    def console_tail(self) -> str:
        return self._console_tail.decode(errors="replace")

    async def execute(self, request: ExecRequest) -> ExecOutcome:
        """Run code in the guest and wait for its exit. Output streams to the callbacks."""
        if self._broken is not None:
            raise self._broken
        exec_id = self._next_id
        self._next_id += 1
        run = _Execution(
            stdout=_OutputStream("stdout", request.on_stdout),
            stderr=_OutputStream("stderr", request.on_stderr),
            done=self._loop.create_future(),
            limits=(request.stdout_limit, request.stderr_limit),
        )
        self._runs[exec_id] = run
        try:
            pending = self._vm.send_exec(
                exec_id,
                LANGUAGE_CODES[request.language],
                request.timeout_ms,
                request.stdout_limit,
                request.stderr_limit,
                request.env,
                request.code,
                session=request.session,
            )
            self._want_write(pending)
            # The guest enforces the timeout; the host waits a little longer and then gives up
            # on a guest that stalls, so that a hostile guest cannot hold the caller.
            from .limits import HOST_TIMEOUT_GRACE_SECONDS

            deadline = request.timeout_ms / 1000 + HOST_TIMEOUT_GRACE_SECONDS
            try:
                exit_code, flags, duration_us = await asyncio.wait_for(
                    asyncio.shield(run.done), deadline
                )
            except asyncio.TimeoutError:
                log.warning("guest did not report the end of execution %d in time: killing the VM",
                            exec_id)  # fmt: skip
                self.close()
                exit_code, flags, duration_us = -1, EXIT_TIMED_OUT, int(deadline * 1e6)
            return ExecOutcome(
                stdout=run.stdout.text(),
                stderr=run.stderr.text(),
                exit_code=exit_code,
                flags=flags,
                duration_us=duration_us,
            )
        finally:
            self._runs.pop(exec_id, None)

    # --- file transfers (sessions) ---

    def open_transfer(self, on_data: Callable[[bytes], None] | None = None,
                      on_entries: Callable[[list[tuple[bytes, bool, int]]], None] | None = None,
                      ) -> FileTransfer:  # fmt: skip
        """Register a file request; send its frames with send_file_frame(transfer.id, ...) and
        release it with close_transfer()."""
        if self._broken is not None:
            raise self._broken
        transfer = FileTransfer(self._next_id, self._loop.create_future(), on_data, on_entries)
        self._next_id += 1
        self._transfers[transfer.id] = transfer
        return transfer

    def close_transfer(self, transfer: FileTransfer) -> None:
        self._transfers.pop(transfer.id, None)
        if transfer.done.done() and not transfer.done.cancelled():
            transfer.done.exception()  # retrieved: nobody may be waiting any more

    def send_file_frame(self, msg_type: int, transfer_id: int, payload: bytes | memoryview) -> int:
        """Queue one FILE_* frame; returns the bytes still queued for the guest."""
        if self._broken is not None:
            raise self._broken
        pending = int(self._vm.send_file_frame(msg_type, transfer_id, payload))
        self._want_write(pending)
        return pending

    async def wait_flushed(self) -> None:
        """Wait until every queued byte went to the guest (flow control for big writes)."""
        if self._broken is not None:
            raise self._broken
        if not self._writing:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._flushed.append(waiter)
        await waiter

    def close(self) -> None:
        """Kill QEMU, reap it and close every fd. Idempotent."""
        if self._vm.closed:
            return
        for fd in (self._vm.channel_fd, self._vm.console_fd, self._vm.pidfd):
            if fd >= 0:
                self._loop.remove_reader(fd)
        if self._writing:
            self._loop.remove_writer(self._vm.channel_fd)
            self._writing = False
        self._vm.close()
        self._fail(VmTransientError("the VM was closed"))

    # --- event handlers, called by the loop ---

    def _on_channel(self) -> None:
        try:
            events = self._vm.read_events()
        except _execsbx.ProtocolError as exc:
            self._loop.remove_reader(self._vm.channel_fd)
            self._fail(GuestAgentError(f"guest agent broke the protocol: {exc}"))
            self.close()
            return
        for event in events:
            self._dispatch(event)

    def _dispatch(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "eof":
            self._loop.remove_reader(self._vm.channel_fd)
            self._fail(CommunicationOutcomeUnknownError("the channel to the guest was closed"))
            return
        exec_id = event[1]
        if kind == "ready":
            if not self._ready.done():
                self._ready.set_result(None)
            return
        if kind == "pong":
            return
        if kind.startswith("file_"):
            self._dispatch_file(kind, exec_id, event)
            return
        run = self._runs.get(exec_id)
        if run is None:
            log.debug("event %s for unknown execution %d ignored", kind, exec_id)
            return
        if kind in ("stdout", "stderr"):
            stream = run.stdout if kind == "stdout" else run.stderr
            limit = run.limits[0] if kind == "stdout" else run.limits[1]
            # The guest enforces the limit; a guest that ignores it is cut off here.
            if stream.byte_count + len(event[2]) > limit:
                self._complete(run, GuestAgentError(f"guest sent more {kind} than its limit"))
                self.close()
                return
            stream.feed(event[2])
        elif kind == "exit":
            self._complete(run, (event[2], event[3], event[4]))
        elif kind == "error":
            self._complete(run, GuestAgentError(f"guest agent error {event[2]}: {event[3]}"))

    def _dispatch_file(self, kind: str, transfer_id: int, event: tuple[Any, ...]) -> None:
        transfer = self._transfers.get(transfer_id)
        if transfer is None or transfer.done.done():
            log.debug("event %s for unknown transfer %d ignored", kind, transfer_id)
            return
        if kind == "file_done":
            transfer.done.set_result(event[2])
        elif kind == "file_error":
            transfer.done.set_exception(GuestFileError(event[2], event[3]))
        else:
            sink = transfer.on_data if kind == "file_data" else transfer.on_entries
            if sink is None:
                # The guest answered a request with the wrong kind of data: a lie costs the VM.
                self._fail(GuestAgentError(f"guest sent {kind} for a request that expects none"))
                self.close()
                return
            try:
                sink(event[2])
            except BaseException as exc:  # noqa: BLE001 - e.g. the destination file failed
                transfer.done.set_exception(exc)

    def _complete(self, run: _Execution, outcome: tuple[int, int, int] | BaseException) -> None:
        if run.done.done():
            return
        if isinstance(outcome, BaseException):
            run.done.set_exception(outcome)
        else:
            run.done.set_result(outcome)

    def _on_console(self) -> None:
        data = self._vm.read_console()
        if not data:
            self._loop.remove_reader(self._vm.console_fd)
            return
        self._console_tail += data
        del self._console_tail[:-_CONSOLE_TAIL_BYTES]
        if self._on_boot_log is not None:
            try:
                self._on_boot_log(data.decode(errors="replace"))
            except Exception as exc:
                warnings.warn(f"on_boot_log callback raised {exc!r}; disabled", RuntimeWarning,
                              stacklevel=1)  # fmt: skip
                self._on_boot_log = None

    def _on_qemu_exit(self) -> None:
        status = self._vm.poll_exit()
        if status is None:
            return
        self._loop.remove_reader(self._vm.pidfd)
        # Drain what the console still holds: it usually says why QEMU stopped.
        while data := self._vm.read_console():
            self._console_tail += data
        del self._console_tail[:-_CONSOLE_TAIL_BYTES]
        if not self._exited.done():
            self._exited.set_result(status)
        self._fail(VmTransientError(f"QEMU exited with status {status}{self._console_hint()}"))

    def _want_write(self, pending: int) -> None:
        if pending > 0 and not self._writing:
            self._writing = True
            self._loop.add_writer(self._vm.channel_fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            pending = self._vm.flush()
        except OSError as exc:
            self._loop.remove_writer(self._vm.channel_fd)
            self._writing = False
            self._fail(CommunicationOutcomeUnknownError(f"writing to the guest failed: {exc}"))
            return
        if pending == 0:
            self._loop.remove_writer(self._vm.channel_fd)
            self._writing = False
            waiters, self._flushed = self._flushed, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        """The VM can no longer run anything: fail whoever waits on it."""
        if self._broken is None:
            self._broken = error
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # mark retrieved: boot() may already have given up
        for run in list(self._runs.values()):
            if not run.done.done():
                run.done.set_exception(
                    error
                    if not isinstance(error, VmTransientError)
                    else CommunicationOutcomeUnknownError(str(error))
                )
                run.done.exception()  # retrieved here: execute() may have stopped waiting
        for transfer in list(self._transfers.values()):
            if not transfer.done.done():
                transfer.done.set_exception(CommunicationOutcomeUnknownError(str(error)))
                transfer.done.exception()
        waiters, self._flushed = self._flushed, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(CommunicationOutcomeUnknownError(str(error)))
                waiter.exception()

    def _console_hint(self) -> str:
        tail = self.console_tail.strip().splitlines()[-10:]
        return ("; console:\n  " + "\n  ".join(tail)) if tail else ""


def monotonic_ms() -> float:
    return time.monotonic() * 1000
