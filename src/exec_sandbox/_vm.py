"""The asyncio face of one QEMU microVM: the only module that imports the C extension.

The C `Vm` owns the QEMU process and three file descriptors: the agent channel (a socket whose
bytes are decoded into events in C), the guest console (boot log, QEMU's own errors) and a pidfd
that becomes readable when QEMU exits; VMs made for memory snapshots have a fourth, the QMP
socket (`qmp.py`). This module registers those fds with the running loop
(`add_reader`), so that nothing here ever blocks the loop, and turns events into futures.

Starting and stopping QEMU never block the loop either: `_execsbx.Vm()` returns right after the
fork and its exec is awaited on the spawn error pipe (`spawn_fd`); closing SIGKILLs QEMU at once,
awaits its pidfd, and leaves the reap, the fds and the cgroup's removal (which may retry for a
while when the kernel is slow to empty it) to an executor thread. Every such release is tracked
until it is done: `wait_released()` (Scheduler.close() awaits it) returns once none is left.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import os
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _execsbx
from .errors import (
    CommunicationError,
    CommunicationOutcomeUnknownError,
    GuestAgentError,
    SandboxError,
    SnapshotError,
    VmPermanentError,
    VmTimeoutError,
    VmTransientError,
)
from .images import GuestImages
from .jail import report_layers
from .models import Language
from .packages.layer import PackageLayer
from .qmp import QmpClient, QmpError

log = logging.getLogger("exec_sandbox")

LANGUAGE_CODES: dict[Language, int] = {
    "python": _execsbx.LANG_PYTHON,
    "javascript": _execsbx.LANG_JAVASCRIPT,
    "raw": _execsbx.LANG_RAW,
}
# Languages with a pre-started interpreter (PRESTART): all of them (even bash: under TCG, creating
# its process costs ~0.1 s).
_PRESTART_LANGUAGES: frozenset[Language] = frozenset({"python", "javascript", "raw"})
EXIT_TIMED_OUT = _execsbx.EXIT_TIMED_OUT
EXIT_STDOUT_LIMIT = _execsbx.EXIT_STDOUT_LIMIT
EXIT_STDERR_LIMIT = _execsbx.EXIT_STDERR_LIMIT
# A guest process ended by SIGKILL (128 + 9), not by the timeout: in a sandbox that is almost
# always the guest kernel's OOM killer.
EXIT_SIGKILL = 137
PROTOCOL_VERSION = int(_execsbx.PROTOCOL_VERSION)
# What the wire protocol bounds (src/shared/protocol.h, which the guest agent is built with):
# limits.py takes the API's limits from here, so that the three sides cannot disagree.
PROTOCOL_LIMITS: dict[str, int] = {
    name: int(getattr(_execsbx, name))
    for name in ("CODE_MAX", "STDOUT_LIMIT_DEFAULT", "STDERR_LIMIT_DEFAULT", "ENV_MAX_COUNT",
                 "ENV_NAME_MAX", "ENV_VALUE_MAX", "TIMEOUT_MS_MIN", "TIMEOUT_MS_MAX")
}  # fmt: skip
OOM_NOTE = (
    "\nKilled by SIGKILL (exit 137): most likely the VM ran out of memory and its kernel's OOM "
    "killer ended the process; give it more memory (memory_mb) or make the code use less\n"
)
_CONSOLE_TAIL_BYTES = 16 * 1024

# The file-transfer protocol (files.py speaks it through GuestVm.send_file_frame): limits, frame
# types, the mode flag and FILE_ERROR kinds, as the C core defines them.
FILE_SIZE_MAX = int(_execsbx.FILE_SIZE_MAX)
PATH_MAX = int(_execsbx.PATH_MAX)
PATH_COMPONENT_MAX = int(_execsbx.PATH_COMPONENT_MAX)
FILE_EXECUTABLE = int(_execsbx.FILE_EXECUTABLE)
MSG_FILE_WRITE_BEGIN = int(_execsbx.MSG_FILE_WRITE_BEGIN)
MSG_FILE_WRITE_DATA = int(_execsbx.MSG_FILE_WRITE_DATA)
MSG_FILE_WRITE_END = int(_execsbx.MSG_FILE_WRITE_END)
MSG_FILE_READ = int(_execsbx.MSG_FILE_READ)
MSG_FILE_LIST = int(_execsbx.MSG_FILE_LIST)
FILE_ERR_PATH = int(_execsbx.FILE_ERR_PATH)
FILE_ERR_NOT_FOUND = int(_execsbx.FILE_ERR_NOT_FOUND)
FILE_ERR_TOO_LARGE = int(_execsbx.FILE_ERR_TOO_LARGE)
FILE_ERR_PROTOCOL = int(_execsbx.FILE_ERR_PROTOCOL)

OutputCallback = Callable[[str], None]

# x-ignore-shared: migration skips RAM in a shared memory-backend-file (the template's RAM file is
# the snapshot's memory; the stream holds only device state).
# A device-state stream of these VMs is ~50 KB; anything far larger is not ours.
_STATE_MAX_BYTES = 64 * 1024 * 1024
_STATE_DRAIN_TIMEOUT_SECONDS = 30.0
_QMP_CONNECT_TIMEOUT_SECONDS = 10.0
_IGNORE_SHARED = {"capabilities": [{"capability": "x-ignore-shared", "state": True}]}
# migrate-set-parameters max-bandwidth (bytes/s): as fast as the host can write.
_UNCAPPED_BANDWIDTH = 1 << 40
# Trivial programs that page an interpreter in (warm_up).
# Each prints, so that the output path is warmed up too.
_WARM_UP_CODE: dict[Language, bytes] = {
    "python": b"print(0)\n",
    "javascript": b"console.log(0);\n",
    "raw": b"echo 0\n",
}


def measure_tsc_khz() -> int:
    return int(_execsbx.tsc_khz())


def seccomp_rules() -> list[tuple[str, str, str]]:
    """The host seccomp deny-list as (syscall, action, reason), as the C core builds it."""
    return list(_execsbx.seccomp_rules())


def probe_jail(
    stand_in: str, jail: dict[str, int], wait_seconds: float = 5.0
) -> tuple[int | None, list[tuple[str, bool, str]]]:
    """Spawn `stand_in` (e.g. /bin/true) under `jail` exactly as QEMU would be spawned, for `sbx
    doctor`: returns its exit status (None: still running after `wait_seconds`, then killed) and
    each jail layer as (layer, active, detail). Blocks: not for the event loop."""
    vm = _execsbx.Vm(qemu_binary=stand_in, kernel="probe", rootfs="probe", memory_mb=128,
                     jail=jail)  # fmt: skip
    try:
        vm.wait_spawn()
        deadline = time.monotonic() + wait_seconds
        status = vm.poll_exit()
        while status is None and time.monotonic() < deadline:
            time.sleep(0.01)
            status = vm.poll_exit()
    finally:
        vm.close()
    return status, list(vm.jail_status())


class VmRegistry:
    """Every GuestVm of one owner (a Scheduler) from the moment its QEMU is spawned until it is
    closed, booting ones included: closing the registry kills them all and refuses new spawns,
    so nothing of the owner runs after its close() (issue 12, item 12)."""

    def __init__(self) -> None:
        self._vms: set[GuestVm] = set()
        # QEMUs forked whose exec is not confirmed yet (no GuestVm so far): close() kills them
        # too, and wait_started() waits until their spawns have released them.
        self._starting: set[Any] = set()
        self._started = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._vms)

    def check_open(self) -> None:
        if self.closed:
            raise SandboxError("the scheduler is closed")

    def add(self, vm: GuestVm) -> None:
        self._vms.add(vm)

    def discard(self, vm: GuestVm) -> None:
        self._vms.discard(vm)

    def starting(self, vm: Any) -> None:
        self._starting.add(vm)

    def started(self, vm: Any) -> None:
        self._starting.discard(vm)
        if not self._starting:
            self._started.set()

    def close(self) -> None:
        """Refuse new VMs and kill every registered one, starting ones included (their release
        follows: wait_started(), then wait_released()). Idempotent."""
        self.closed = True
        for vm in self._starting:
            vm.kill()
        while self._vms:
            self._vms.pop().close()

    async def wait_started(self) -> None:
        """Until no spawn is between its fork and its GuestVm (after close(): each of them has
        handed its QEMU to a release, which wait_released() then waits for)."""
        while self._starting:
            self._started.clear()
            await self._started.wait()


# Releases in progress (see the module docstring), per loop.
_releasing: set[asyncio.Task[None]] = set()
# One fork per turn of the loop: a fork copies this process's page tables (2-4 ms of CPU here),
# and 8 VMs started at once would otherwise fork back to back in one turn, holding the loop for
# 8 times that. The lock is released on the loop's next turn (call_soon), so other callbacks run
# between two forks.
_spawn_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Wait until fd is readable, through the loop."""
    ready: asyncio.Future[None] = loop.create_future()

    def on_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _wait_started(loop: asyncio.AbstractEventLoop, vm: Any) -> None:
    """Wait for QEMU's exec; the error the child reported before it, as VmPermanentError (no
    such binary) or VmTransientError."""
    while True:
        try:
            if vm.check_spawn():
                return
        except FileNotFoundError as exc:
            raise VmPermanentError(f"cannot start QEMU: {exc}") from exc
        except OSError as exc:
            raise VmTransientError(f"cannot start QEMU: {exc}") from exc
        await _readable(loop, vm.spawn_fd)


def _release(loop: asyncio.AbstractEventLoop, vm: Any) -> asyncio.Task[None]:
    """SIGKILL QEMU now; reap it, close its fds and remove its cgroup without blocking the
    loop. The task is tracked until done (wait_released)."""
    vm.kill()
    task = loop.create_task(_reap_and_close(loop, vm), name=f"release-qemu-{vm.pid}")
    _releasing.add(task)
    task.add_done_callback(_releasing.discard)
    return task


async def _reap_and_close(loop: asyncio.AbstractEventLoop, vm: Any) -> None:
    try:
        # The pidfd is readable once QEMU has exited (also once reaped); without one (Linux
        # < 5.3) the reap below waits for it in the thread instead. Not reaped here: reaping a
        # PID namespace's init flushes its /proc entries, milliseconds on a busy host.
        if vm.pidfd >= 0:
            await _readable(loop, vm.pidfd)
    except BaseException:
        vm.close()  # cancelled (the loop is going away): finish here rather than leave QEMU
        raise
    # Reaps (at once: it has exited), closes the fds, reads the cgroup's figures and removes it.
    # Not on the loop: removing a cgroup retries while the kernel still holds it (cgroup.c).
    closing = loop.run_in_executor(None, vm.close)
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await asyncio.wait({closing})  # a thread cannot be stopped: let it finish first
        raise


async def wait_released() -> None:
    """Wait until every VM closed on this loop so far is reaped and its cgroup removed."""
    loop = asyncio.get_running_loop()
    while pending := [task for task in _releasing if task.get_loop() is loop]:
        await asyncio.wait(pending)


@dataclass(frozen=True)
class VmSpec:
    """Everything that decides how one VM is started."""

    qemu_binary: str
    images: GuestImages
    accel: str
    memory_mb: int
    vcpus: int = 1
    kernel_cmdline_extra: str = ""
    # Memory snapshots: guest RAM in this file, mapped shared (making a template) or private
    # (a copy-on-write clone of one); a QMP monitor to drive the migration.
    mem_path: str | None = None
    mem_fd: int | None = None  # instead of mem_path: this fd (kept by the caller) is the RAM
    mem_shared: bool = False
    qmp: bool = False
    # The host jail (jail.py, src/_execsbx/jail.c): None runs QEMU without it.
    jail: dict[str, int] | None = None
    qemu_sandbox: bool = False
    # A package layer (packages/): a read-only EROFS image the guest mounts for this language.
    layer: PackageLayer | None = None
    # The network port (issue 13, src/shared/net_protocol.h): a third virtio-serial port whose host
    # end is Vm.net_fd. Part of the device layout.
    net_port: bool = False
    # Where the VM registers itself from spawn to close (not part of what starts the VM).
    registry: VmRegistry | None = field(default=None, compare=False, hash=False)


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

    spec: VmSpec  # what it was started with (set by _spawn)

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
        # Bytes the guest has taken off the channel (flow control: a file transfer whose queue
        # does not shrink for a long time means a stalled guest or QEMU).
        self.bytes_flushed = 0
        self._pending = 0
        self._next_id = 1
        self._registry: VmRegistry | None = None
        self._broken: BaseException | None = None
        self._writing = False
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._released: asyncio.Task[None] | None = None  # set by close()
        self.qmp: QmpClient | None = None
        # Filled in by restore(): QEMU start -> guest running, and the RESEED round trip.
        self.restore_seconds = 0.0
        self.connect_seconds = 0.0
        self.pid: int = vm.pid
        loop.add_reader(vm.channel_fd, self._on_channel)
        loop.add_reader(vm.console_fd, self._on_console)
        loop.add_reader(vm.pidfd, self._on_qemu_exit)

    @classmethod
    async def boot(cls, spec: VmSpec, *, boot_timeout: float,
                   on_boot_log: OutputCallback | None = None) -> GuestVm:  # fmt: skip
        """Start QEMU and wait until the guest agent is ready. Raises VmTimeoutError or
        VmTransientError (with the console's last lines) if it is not; the VM is gone then."""
        guest = await cls._spawn(spec, incoming=False, on_boot_log=on_boot_log)
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

    @classmethod
    async def _spawn(cls, spec: VmSpec, *, incoming: bool,
                     on_boot_log: OutputCallback | None) -> GuestVm:  # fmt: skip
        loop = asyncio.get_running_loop()
        spawn_lock = _spawn_locks.setdefault(loop, asyncio.Lock())
        await spawn_lock.acquire()
        if spec.registry is not None and spec.registry.closed:
            loop.call_soon(spawn_lock.release)
            spec.registry.check_open()
        try:
            try:
                vm = _execsbx.Vm(
                    qemu_binary=spec.qemu_binary,
                    kernel=str(spec.images.kernel),
                    rootfs=str(spec.images.rootfs),
                    memory_mb=spec.memory_mb,
                    vcpus=spec.vcpus,
                    accel=spec.accel,
                    kernel_cmdline_extra=spec.kernel_cmdline_extra,
                    qmp=spec.qmp or incoming,
                    mem_path=spec.mem_path,
                    mem_fd=-1 if spec.mem_fd is None else spec.mem_fd,
                    mem_shared=spec.mem_shared,
                    incoming=incoming,
                    qemu_sandbox=spec.qemu_sandbox,
                    jail=spec.jail,
                    layer=None if spec.layer is None else str(spec.layer.path),
                    layer_kind=None if spec.layer is None else spec.layer.kind,
                    net_port=spec.net_port,
                )
            finally:
                loop.call_soon(spawn_lock.release)
        except FileNotFoundError as exc:
            raise VmPermanentError(f"cannot start QEMU: {exc}") from exc
        except OSError as exc:
            raise VmTransientError(f"cannot start QEMU: {exc}") from exc
        if spec.registry is not None:
            spec.registry.starting(vm)
        try:
            await _wait_started(loop, vm)
            if spec.registry is not None:
                spec.registry.check_open()  # closed while QEMU was starting: it goes at once
        except BaseException:
            _release(loop, vm)
            raise
        finally:
            if spec.registry is not None:
                spec.registry.started(vm)
        report_layers(vm.jail_status())
        guest = cls(vm, loop, on_boot_log)
        guest.spec = spec
        if spec.registry is not None:
            guest._registry = spec.registry
            spec.registry.add(guest)
        return guest

    @classmethod
    async def restore(cls, spec: VmSpec, state_path: str, *, timeout: float,
                      on_boot_log: OutputCallback | None = None,
                      ram_in_stream: bool = False, run: bool = True) -> GuestVm:  # fmt: skip
        """Start a clone of a memory snapshot: QEMU maps spec.mem_path (the template's RAM)
        privately, loads the device state from state_path over QMP and resumes. The guest's
        RNG is reseeded before this returns, so nothing runs on the template's RNG state.

        ram_in_stream: state_path is a full stream (a paused session: RAM included), loaded
        into spec's RAM, which may then be a shared file (making a fork template). run=False
        leaves the VM stopped after the load (no cont, no RESEED): it is only saved again.

        Raises VmTransientError (or QmpError, VmTimeoutError) if the clone does not come up;
        the VM is gone then."""
        guest = await cls._spawn(spec, incoming=True, on_boot_log=on_boot_log)
        try:
            await asyncio.wait_for(guest._restore(state_path, timeout, ram_in_stream, run), timeout)
        except asyncio.TimeoutError:
            guest.close()
            raise VmTimeoutError(
                f"snapshot restore did not finish within {timeout:.0f} s{guest._console_hint()}"
            ) from None
        except BaseException:
            guest.close()
            raise
        return guest

    async def _restore(self, state_path: str, timeout: float, ram_in_stream: bool,
                       run: bool) -> None:  # fmt: skip
        started = time.monotonic()
        self.qmp = await QmpClient.connect(self._vm.qmp_fd, timeout)
        # A template's stream has no RAM (it is in the shared file); a full stream has it, and
        # a destination that ignores shared RAM would refuse pages for its shared file.
        if not ram_in_stream:
            await self.qmp.execute("migrate-set-capabilities", _IGNORE_SHARED)
        fd = os.open(state_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            await self.qmp.execute("getfd", {"fdname": "state"}, fds=[fd])
        finally:
            os.close(fd)  # QEMU holds its own copy now
        await self.qmp.execute("migrate-incoming", {"uri": "fd:state"})
        await self._wait_migration()
        if not run:
            self.restore_seconds = time.monotonic() - started
            return
        await self.qmp.execute("cont")
        # The guest never sends READY again: it was sent before the snapshot.
        if not self._ready.done():
            self._ready.set_result(None)
        running = time.monotonic()
        self.restore_seconds = running - started
        await self.reseed()
        self.connect_seconds = time.monotonic() - running

    async def save_snapshot(self, state_path: str) -> None:
        """Stop this VM and write its device state to state_path. Its RAM must be in a shared
        mem_path file (VmSpec.mem_shared): with x-ignore-shared the stream skips it, so saving
        costs milliseconds. The VM stays stopped; the caller destroys it."""
        await self._save(state_path, ram=False, limit=_STATE_MAX_BYTES)

    async def save_state(self, state_path: str) -> None:
        """Stop this VM and write its whole state, RAM included, to state_path (a paused or
        forked session). The VM stays stopped: close() it, or cont() to go on running."""
        await self._save(state_path, ram=True,
                         limit=self.spec.memory_mb * 1024 * 1024 + _STATE_MAX_BYTES)  # fmt: skip

    async def cont(self) -> None:
        """Run a VM stopped by save_state() again (QEMU takes its disks back)."""
        await (await self.monitor()).execute("cont")

    async def monitor(self) -> QmpClient:
        """The VM's QMP client, connected on first use (QEMU's greeting waits in the socket):
        not on the boot path, where a VM killed mid-boot must not leave a handshake waiting."""
        if self.qmp is None:
            if self._vm.qmp_fd < 0:
                raise QmpError("this VM has no QMP monitor")
            self.qmp = await QmpClient.connect(self._vm.qmp_fd, _QMP_CONNECT_TIMEOUT_SECONDS)
        return self.qmp

    async def _save(self, state_path: str, *, ram: bool, limit: int) -> None:
        await self.monitor()
        assert self.qmp is not None
        await self.qmp.execute(
            "migrate-set-capabilities",
            {"capabilities": [{"capability": "x-ignore-shared", "state": not ram}]},
        )
        if ram:
            # The default 128 MiB/s cap would make a 192 MiB guest's save take over a second.
            await self.qmp.execute("migrate-set-parameters", {"max-bandwidth": _UNCAPPED_BANDWIDTH})
        await self.qmp.execute("stop")
        # Through a pipe the host drains into the file: a jailed QEMU may not write files
        # (RLIMIT_FSIZE 0) and cannot open one by path (read-only mounts).
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        copier = asyncio.get_running_loop().run_in_executor(
            None, _drain_to_file, read_end, state_path, limit
        )
        try:
            try:
                await self.qmp.execute("getfd", {"fdname": "state"}, fds=[write_end])
            finally:
                os.close(write_end)  # QEMU holds its own copy; EOF once it closes that
            await self.qmp.execute("migrate", {"uri": "fd:state"})
            await self._wait_migration()
            # QEMU closes its copy of the pipe when the migration has completed: EOF.
            await asyncio.wait_for(asyncio.shield(copier), _STATE_DRAIN_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            # The copier thread ends at EOF, once QEMU is gone: end both here, so that the
            # thread's files are closed before this returns.
            self.close()
            await asyncio.wait({copier})
            _retrieve(copier)
            raise
        except BaseException as exc:
            # The guest is intact, only stopped (a full disk, a stream over its limit, a failed
            # migration): cancel the migration, and give the VM its run back.
            await self._abandon_save(copier)
            raise SnapshotError(f"saving the VM's state failed: {exc}") from exc

    async def _abandon_save(self, copier: asyncio.Future[None]) -> None:
        assert self.qmp is not None
        try:
            await asyncio.wait_for(self.qmp.execute("migrate_cancel"), _QMP_CONNECT_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - the VM is ended below if it cannot go on
            pass
        _done, pending = await asyncio.wait({copier}, timeout=_STATE_DRAIN_TIMEOUT_SECONDS)
        if pending:  # QEMU still holds the pipe: only its end ends the copier
            self.close()
            await asyncio.wait({copier})
        _retrieve(copier)
        if self.alive:
            try:
                await asyncio.wait_for(self.qmp.execute("cont"), _QMP_CONNECT_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - a VM that cannot run on is of no use
                self.close()

    async def _wait_migration(self) -> None:
        assert self.qmp is not None
        while True:
            info = await self.qmp.execute("query-migrate")
            status = info.get("status") if isinstance(info, dict) else None
            if status == "completed":
                return
            if status in ("failed", "cancelled", None):
                detail = info.get("error-desc", "") if isinstance(info, dict) else ""
                raise QmpError(f"migration {status}: {str(detail)[:300]}")
            await asyncio.sleep(0.002)

    async def reseed(self, timeout: float = 10.0) -> None:
        """Give the guest kernel fresh entropy from the host and the host's clock, and wait
        until its CRNG is reseeded (every clone of one snapshot starts from the same RNG state
        and the clock of the moment the snapshot was taken)."""
        if self._broken is not None:
            raise self._broken
        req_id = self._next_id
        self._next_id += 1
        done: asyncio.Future[None] = self._loop.create_future()
        self._acks[req_id] = done
        try:
            self._want_write(
                self._vm.send_reseed(req_id, os.urandom(_execsbx.RESEED_BYTES), time.time_ns())
            )
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            raise VmTimeoutError("the guest did not acknowledge RESEED in time") from None
        finally:
            self._acks.pop(req_id, None)

    async def warm_up(self, language: Language) -> None:
        """Make this VM ready to serve `language` fast: run a trivial program once, so the
        interpreter's files are in the guest page cache (and, through a pre-started interpreter,
        that path translated by QEMU). A one-shot process, never the session REPL: templates are
        made after this, and a REPL cloned into many VMs would share its user-space RNG state
        (docs/design.md, "Speed tiers")."""
        outcome = await self.execute(
            ExecRequest(
                language=language,
                code=_WARM_UP_CODE[language],
                timeout_ms=60_000,
                env=[],
                stdout_limit=4096,
                stderr_limit=4096,
            )
        )
        if outcome.exit_code != 0:
            raise VmTransientError(
                f"warm-up of {language} exited with {outcome.exit_code}: {outcome.stderr[:300]}"
            )

    async def prestart(self, language: Language, timeout: float = 60.0) -> bool:
        """Have the guest start the interpreter for the next one-shot EXEC of `language` now,
        waiting on a bootstrap for its code (protocol.h, PRESTART): a pool hit then skips the
        interpreter's start-up. After the RESEED of a restored VM; in a snapshot template only
        for the languages of snapshots.TEMPLATE_PRESTART_LANGUAGES. False for a language
        without one."""
        if language not in _PRESTART_LANGUAGES:
            return False
        if self._broken is not None:
            raise self._broken
        req_id = self._next_id
        self._next_id += 1
        done: asyncio.Future[None] = self._loop.create_future()
        self._acks[req_id] = done  # PONG acknowledges it; an ERROR fails it
        try:
            self._want_write(self._vm.send_prestart(req_id, LANGUAGE_CODES[language]))
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            raise VmTimeoutError("the guest did not acknowledge PRESTART in time") from None
        finally:
            self._acks.pop(req_id, None)
        return True

    async def ping(self, timeout: float = 5.0) -> None:
        """One channel round trip to the agent (PING/PONG)."""
        if self._broken is not None:
            raise self._broken
        req_id = self._next_id
        self._next_id += 1
        done: asyncio.Future[None] = self._loop.create_future()
        self._acks[req_id] = done  # PONG completes it like RESEEDED
        try:
            self._want_write(self._vm.send_ping(req_id))
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            raise VmTimeoutError("the guest did not answer PING in time") from None
        finally:
            self._acks.pop(req_id, None)

    @property
    def alive(self) -> bool:
        return self._broken is None and self._released is None

    @property
    def jail_status(self) -> list[tuple[str, bool, str]]:
        """(layer, active, detail) of the host jail around this VM's QEMU."""
        return list(self._vm.jail_status())

    def resource_usage(self) -> tuple[int | None, int | None] | None:
        """(cpu_ns, memory_peak_bytes) of QEMU from its cgroup: so far while it runs, final
        once closed; None without a cgroup. While it runs this reads cgroup files, which can
        wait on kernel locks: call it from an executor thread (the GIL is released)."""
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
            except OSError as exc:
                # The channel is gone (QEMU died before its exit reached the loop): the VM can
                # run nothing more, and the caller gets the library's error, not an OSError.
                error = CommunicationError(f"cannot send to the guest: {exc}")
                self._fail(error)
                raise error from exc
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
        """Kill QEMU now and fail whatever waits on this VM. Reaping QEMU, closing the fds and
        removing its cgroup follow without blocking the loop: aclose() waits for them, and
        Scheduler.close() for those of every VM (wait_released). Idempotent."""
        if self._registry is not None:
            self._registry.discard(self)
        if self._released is not None:
            return
        for fd in (self._vm.channel_fd, self._vm.console_fd, self._vm.pidfd):
            if fd >= 0:
                self._loop.remove_reader(fd)
        if self._writing:
            self._loop.remove_writer(self._vm.channel_fd)
            self._writing = False
        if self.qmp is not None:
            self.qmp.close()
        self._released = _release(self._loop, self._vm)
        self._fail(VmTransientError("the VM was closed"))

    async def aclose(self) -> None:
        """close(), then wait until QEMU is reaped and its cgroup removed."""
        self.close()
        assert self._released is not None
        await asyncio.shield(self._released)

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
            if not self._ready.done():
                # Before READY nothing was dispatched: QEMU failed to start (bad kernel or
                # image, too much memory, not QEMU at all). Its exit, due any moment, fails
                # the boot with VmTransientError and QEMU's own message from the console
                # socket; a QEMU that lingers is caught by the boot timeout.
                return
            self._fail(CommunicationOutcomeUnknownError("the channel to the guest was closed"))
            return
        exec_id = event[1]
        if kind == "ready":
            if not self._ready.done():
                version = event[2]
                if version != PROTOCOL_VERSION:
                    # Images built by another version of this library: nothing it would send
                    # could be trusted to mean the same. Retrying cannot help.
                    self._ready.set_exception(VmPermanentError(
                        f"the guest agent speaks protocol version {version}, this library "
                        f"{PROTOCOL_VERSION}: rebuild the guest images (sbx setup)"
                    ))  # fmt: skip
                else:
                    self._ready.set_result(None)
            return
        if kind in ("pong", "reseeded"):
            waiter = self._acks.get(exec_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if kind == "error" and exec_id in self._acks:
            waiter = self._acks[exec_id]
            if not waiter.done():
                waiter.set_exception(GuestAgentError(f"guest agent error {event[2]}: {event[3]}"))
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
        self._pending = pending
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
        if pending < self._pending:
            self.bytes_flushed += self._pending - pending
        self._pending = pending
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
        for waiter in list(self._acks.values()):
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()
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


def _drain_to_file(read_end: int, path: str, limit: int) -> None:
    """Copy a pipe into a new file until EOF (blocking; owns read_end). OSError over limit."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            total = 0
            while chunk := os.read(read_end, 1 << 16):
                total += len(chunk)
                if total > limit:
                    raise OSError(f"migration stream over {limit} bytes")
                os.write(fd, chunk)
        finally:
            os.close(fd)
    finally:
        os.close(read_end)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def ram_memfd(memory_mb: int) -> int:
    """An empty memfd of the guest's RAM size, sealable: the RAM file of a fork template
    (session_snapshots.fork_vms). The caller closes it once the VMs mapping it are spawned
    (QEMU has its own copy)."""
    fd = os.memfd_create("sbx-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, memory_mb * 1024 * 1024)
    except BaseException:
        os.close(fd)
        raise
    return fd
