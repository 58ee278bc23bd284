"""A booted guest, spoken to over the agent channel (`GuestVm`): the asyncio face of one QEMU.

The C core's Vm (`binding.start_qemu`) owns the QEMU process and three file descriptors: the agent
channel (a socket whose bytes are decoded into events in C), the guest console (boot log, QEMU's
own errors) and a pidfd that becomes readable when QEMU exits; VMs made for memory snapshots have
a fourth, the QMP socket (`qmp.py`, driven by `migration.py`). GuestVm registers those fds with
the running loop (`add_reader`), so that nothing here ever blocks the loop, and turns events into
futures: executions, request/response round trips (PING, PRESTART, RESEED) and file transfers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import (
    CommunicationError,
    CommunicationOutcomeUnknownError,
    GuestAgentError,
    VmPermanentError,
    VmTimeoutError,
    VmTransientError,
)
from ..host_tools import TOOL_ERROR, TOOL_OK
from ..limits import HOST_TIMEOUT_GRACE_SECONDS, NO_TIMEOUT_MS
from ..models import Language, ToolCall
from . import process
from .binding import (
    EXIT_TIMED_OUT,
    LANGUAGE_CODES,
    PROTOCOL_VERSION,
    RESEED_BYTES,
    FileEntriesEvent,
    FileEntry,
    FileRequest,
    OutputEvent,
    ProtocolError,
)
from .execution import (
    INSTALL_TOOL,
    TOOL_CALLS_MAX,
    ExecOutcome,
    ExecRequest,
    Execution,
    OutputCallback,
    OutputStream,
)
from .jail import report_layers
from .qmp import QmpClient
from .registry import VmRegistry
from .spec import VmSpec, with_work_disk

if TYPE_CHECKING:
    from ..network.hub import NetworkHub, VmNetwork
    from ..network.policy import NetworkPolicy
    from .binding import Event

log = logging.getLogger("exec_sandbox")

# Languages with a pre-started interpreter (PRESTART): all of them (even bash: under TCG, creating
# its process costs ~0.1 s).
_PRESTART_LANGUAGES: frozenset[Language] = frozenset({"python", "javascript", "raw"})
_CONSOLE_TAIL_BYTES = 16 * 1024
# Trivial programs that page an interpreter in (warm_up).
# Each prints, so that the output path is warmed up too.
_WARM_UP_CODE: dict[Language, bytes] = {
    "python": b"print(0)\n",
    "javascript": b"console.log(0);\n",
    "raw": b"echo 0\n",
}


class GuestRequestError(GuestAgentError):
    """The guest answered a request with ERROR; `code` is its ERR_* code (processes.py tells
    a missing process from a limit by it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"guest agent error {code}: {message}")
        self.code = code
        self.guest_message = message


# What answers a request of the reply table (proc_request), by the kind the caller expects.
_REPLY_KINDS = frozenset({"proc_info", "proc_data", "pong"})


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
    on_entries: Callable[[list[FileEntry]], None] | None = None


_NO_INSTALLS = (
    "ERROR: installs are served in sessions only (not in run()); "
    "create the sandbox with packages=[...]"
)


class GuestVm:
    """A booted VM whose guest agent has said READY. Create with `await GuestVm.boot(...)`."""

    spec: VmSpec  # what it was started with (set by spawn)

    def __init__(
        self, vm: Any, loop: asyncio.AbstractEventLoop, on_boot_log: OutputCallback | None
    ) -> None:
        self._vm = vm
        self._loop = loop
        self._on_boot_log = on_boot_log
        self._console_tail = bytearray()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._runs: dict[int, Execution] = {}
        self._transfers: dict[int, FileTransfer] = {}
        self._flushed: list[asyncio.Future[None]] = []
        # Bytes the guest has taken off the channel (flow control: a file transfer whose queue
        # does not shrink for a long time means a stalled guest or QEMU).
        self.bytes_flushed = 0
        self._pending = 0
        # Request ids start at a random point: a VM restored from a snapshot (resume, fork) may
        # still answer requests its guest held for the previous host process (PROC_READ and
        # PROC_WAIT wait in the guest), and such a late answer must not match a new request.
        self._next_id = 1 + secrets.randbelow(1 << 30)
        self.registry: VmRegistry | None = None  # its owner's (spawn), which close() leaves
        self._broken: BaseException | None = None
        self._writing = False
        self._acks: dict[int, asyncio.Future[None]] = {}
        # The reply table of the process requests (proc_request): one waiter per request id,
        # resolved by the first PROC_INFO, PROC_DATA, PONG or ERROR of that id.
        self._replies: dict[int, asyncio.Future[Event]] = {}
        self._released: asyncio.Task[None] | None = None  # set by close()
        self.qmp: QmpClient | None = None
        # The VM's network (attach_network), closed with the VM.
        self._network: VmNetwork | None = None
        # Filled in by migration.restore(): QEMU start -> guest running, and the RESEED round trip.
        self.restore_seconds = 0.0
        self.connect_seconds = 0.0
        self.pid: int = vm.pid
        loop.add_reader(vm.channel_fd, self._on_channel)
        loop.add_reader(vm.console_fd, self._on_console)
        loop.add_reader(vm.pidfd, self._on_qemu_exit)

    @classmethod
    async def boot(
        cls,
        spec: VmSpec,
        *,
        registry: VmRegistry | None,
        boot_timeout: float,
        on_boot_log: OutputCallback | None = None,
    ) -> GuestVm:
        """Start QEMU and wait until the guest agent is ready. Raises VmTimeoutError or
        VmTransientError (with the console's last lines) if it is not; the VM is gone then."""
        guest = await cls.spawn(spec, registry=registry, incoming=False, on_boot_log=on_boot_log)
        try:
            await asyncio.wait_for(asyncio.shield(guest._ready), boot_timeout)
        except TimeoutError:
            guest.close()
            raise VmTimeoutError(
                f"guest did not become ready within {boot_timeout:.0f} s{guest.console_hint()}"
            ) from None
        except BaseException:
            guest.close()
            raise
        return guest

    @classmethod
    async def spawn(
        cls,
        spec: VmSpec,
        *,
        registry: VmRegistry | None,
        incoming: bool,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm:
        """Start QEMU for spec and register its fds; not yet READY (boot() waits for that,
        migration.restore() loads a state into it). registry: its owner's, whose close() kills
        it (None: the caller alone owns it)."""
        # Its own work disk (workspace.py), closed with it from here on.
        spec = await with_work_disk(spec)
        # Its own volume locks (volumes/store.py), released by close(): a second VM of a spec
        # (a fork's copy of read-only volumes) takes new ones.
        volumes = None
        claims = spec.volumes
        if claims is not None:
            if claims.given:
                volumes = claims = claims.share()
                spec = replace(spec, volumes=claims)
            claims.given = True
            if spec.jail is not None and spec.jail.get("uid", -1) > 0:
                claims.give_to(spec.jail["uid"], spec.jail.get("gid", spec.jail["uid"]))
        try:
            vm = await process.spawn(spec, incoming=incoming, registry=registry)
        except BaseException:
            if spec.work is not None:
                spec.work.close()
            if volumes is not None:
                volumes.close()
            raise
        report_layers(vm.jail_status())
        loop = asyncio.get_running_loop()
        guest = cls(vm, loop, on_boot_log)
        guest.spec = spec
        if registry is not None:
            guest.registry = registry
            registry.add(guest)
        return guest

    def mark_running(self) -> None:
        """A loaded state runs (migration.restore): the guest sent READY before its snapshot
        was taken and never sends it again."""
        if not self._ready.done():
            self._ready.set_result(None)

    @property
    def qmp_fd(self) -> int:
        """The QMP socket (-1 for a VM started without one)."""
        return int(self._vm.qmp_fd)

    def console_hint(self) -> str:
        """The console's last lines, for an error message."""
        tail = self.console_tail.strip().splitlines()[-10:]
        return ("; console:\n  " + "\n  ".join(tail)) if tail else ""

    async def reseed(self, timeout: float = 10.0) -> None:
        """Give the guest kernel fresh entropy from the host and the host's clock, and wait
        until its CRNG is reseeded (every clone of one snapshot starts from the same RNG state
        and the clock of the moment the snapshot was taken)."""
        await self._round_trip(
            lambda req_id: self._vm.send_reseed(req_id, os.urandom(RESEED_BYTES), time.time_ns()),
            timeout,
            "the guest did not acknowledge RESEED in time",
        )

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
        for the languages of snapshots/l1.py TEMPLATE_PRESTART_LANGUAGES. False for a language
        without one."""
        if language not in _PRESTART_LANGUAGES:
            return False
        # PONG acknowledges it; an ERROR fails it.
        await self._round_trip(
            lambda req_id: self._vm.send_prestart(req_id, LANGUAGE_CODES[language]),
            timeout,
            "the guest did not acknowledge PRESTART in time",
        )
        return True

    async def send_net_config(
        self,
        config: tuple[bool, list[str], list[int], bytes],
        timeout: float = 10.0,
        *,
        reattach: bool = False,
    ) -> None:
        """NET_CONFIG (its values: network/config_frame.py): the agent answers PONG once its DNS
        stub, listeners and CA bundle are set, or ERROR (raised as GuestAgentError). reattach:
        a VM restored with network (net_protocol.h, SBX_NET_CONFIG_REATTACH)."""
        await self._round_trip(
            lambda req_id: int(self._vm.send_net_config(req_id, *config, reattach=reattach)),
            timeout,
            "the guest did not acknowledge NET_CONFIG in time",
        )

    @property
    def net_fd(self) -> int:
        """The host end of the network port (-1 for a VM without one)."""
        return int(self._vm.net_fd)

    @property
    def network(self) -> VmNetwork | None:
        """The VM's network once attached (attach_network), else None."""
        return self._network

    def attach_network(self, hub: NetworkHub, policy: NetworkPolicy) -> VmNetwork:
        """Hand the network port to hub's relay under policy. The network is this VM's from
        now on: closed with it; a guest that breaks the net protocol costs the VM."""
        if self.net_fd < 0:
            raise RuntimeError("the VM was started without its network port")
        if self._network is not None:
            raise RuntimeError("the VM's network is attached already")
        self._network = hub.attach(self.net_fd, policy, self.fail_network)
        return self._network

    def fail_network(self, why: str) -> None:
        """The guest broke the network protocol (network/hub.py): like a bad frame on the agent
        channel, it costs the guest its VM."""
        log.warning("VM %d broke the network protocol (%s): killed", self.pid, why)
        error = CommunicationError(f"the guest broke the network protocol: {why}")
        self._fail(error)
        self.close()

    async def ping(self, timeout: float = 5.0) -> None:
        """One channel round trip to the agent (PING/PONG)."""
        await self._round_trip(self._vm.send_ping, timeout, "the guest did not answer PING in time")

    async def _round_trip(self, send: Callable[[int], int], timeout: float, late: str) -> None:
        """Send one request under a fresh id and wait for its acknowledgement (PONG or
        RESEEDED; an ERROR of that id fails it with GuestAgentError): the one request/response
        path of the channel. `send(id)` queues the frame and returns the bytes still queued;
        VmTimeoutError(late) after `timeout` seconds; the VM's own failure if it breaks."""
        if self._broken is not None:
            raise self._broken
        req_id = self._next_id
        self._next_id += 1
        done: asyncio.Future[None] = self._loop.create_future()
        self._acks[req_id] = done
        try:
            self._want_write(send(req_id))
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            raise VmTimeoutError(late) from None
        finally:
            self._acks.pop(req_id, None)

    async def proc_request(
        self, send: Callable[[Any, int], int], expect: str, timeout: float
    ) -> Event:
        """Send one PROC_* request under a fresh id (`send(vm, id)` queues it on the C core's
        Vm, see Vm.send_proc_*) and return the event that answers it, of kind `expect`
        ("proc_info", "proc_data" or "pong"). An ERROR raises GuestRequestError; an answer of
        another kind is a lie that costs the VM; VmTimeoutError after `timeout` seconds (the
        guest holds PROC_READ and PROC_WAIT up to their wait_ms: the caller adds that); the
        VM's own failure if it breaks meanwhile."""
        if self._broken is not None:
            raise self._broken
        req_id = self._next_id
        self._next_id = self._next_id + 1 if self._next_id < 0xFFFFFFFF else 1
        reply: asyncio.Future[Event] = self._loop.create_future()
        self._replies[req_id] = reply
        try:
            try:
                self._want_write(send(self._vm, req_id))
            except OSError as exc:
                error = CommunicationError(f"cannot send to the guest: {exc}")
                self._fail(error)
                raise error from exc
            try:
                event = await asyncio.wait_for(asyncio.shield(reply), timeout)
            except TimeoutError:
                raise VmTimeoutError(
                    f"the guest did not answer a {expect} request in time"
                ) from None
        finally:
            self._replies.pop(req_id, None)
        if event.kind == "error":
            raise GuestRequestError(event.code, event.message)
        if event.kind != expect:
            error = GuestAgentError(
                f"guest answered a request expecting {expect} with {event.kind}"
            )
            self._fail(error)
            self.close()
            raise error
        return event

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
        run = Execution(
            stdout=OutputStream("stdout", request.on_stdout),
            stderr=OutputStream("stderr", request.on_stderr),
            done=self._loop.create_future(),
            limits=(request.stdout_limit, request.stderr_limit),
            tools=request.tools,
            installer=request.installer,
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
            # on a guest that stalls, so that a hostile guest cannot hold the caller. Without a
            # timeout (0) the caller asked to wait for as long as the code runs.
            deadline = (
                None
                if request.timeout_ms == NO_TIMEOUT_MS
                else request.timeout_ms / 1000 + HOST_TIMEOUT_GRACE_SECONDS
            )
            try:
                exit_code, flags, duration_us = await asyncio.wait_for(
                    asyncio.shield(run.done), deadline
                )
            except TimeoutError:
                log.warning(
                    "guest did not report the end of execution %d in time: killing the VM", exec_id
                )
                self.close()
                assert deadline is not None  # no deadline, no timeout
                exit_code, flags, duration_us = -1, EXIT_TIMED_OUT, int(deadline * 1e6)
            # Calls still running are cut short by the end (a timeout, mostly): logged as such,
            # since the call that held the code is what its caller needs to see.
            now = time.monotonic()
            for name, arguments, started in run.calls.values():
                run.log_call(
                    ToolCall(
                        name,
                        arguments.decode(errors="replace"),
                        False,
                        "cancelled: the execution ended first",
                        int((now - started) * 1000),
                    )
                )
            return ExecOutcome(
                stdout=run.stdout.text(),
                stderr=run.stderr.text(),
                exit_code=exit_code,
                flags=flags,
                duration_us=duration_us,
                outputs=run.outputs.outputs,
                tool_calls=list(run.tool_calls),
            )
        finally:
            self._runs.pop(exec_id, None)
            # Calls still running belong to code that has ended: nobody will read their result.
            for call in list(run.calls):
                call.cancel()

    # --- file transfers (sessions) ---

    def open_transfer(
        self,
        on_data: Callable[[bytes], None] | None = None,
        on_entries: Callable[[list[FileEntry]], None] | None = None,
    ) -> FileTransfer:
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

    def send_file_frame(self, request: FileRequest, transfer_id: int, *args: object) -> int:
        """Queue one FILE_* frame, encoded by the C core (Vm.send_file_<request>(transfer_id,
        *args)); returns the bytes still queued for the guest."""
        if self._broken is not None:
            raise self._broken
        pending = int(getattr(self._vm, f"send_file_{request}")(transfer_id, *args))
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
        if self.registry is not None:
            self.registry.discard(self)
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
        if self._network is not None:
            self._network.close()  # listeners and streams go with the VM
        self._released = process.release(self._loop, self._vm)
        if self.spec.volumes is not None:
            # Another VM may take a volume only once this QEMU can no longer write it.
            volumes = self.spec.volumes
            self._released.add_done_callback(lambda _: volumes.close())
        if self.spec.work is not None:
            self.spec.work.close()  # the file goes once QEMU's fd is closed too
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
        except ProtocolError as exc:
            self._loop.remove_reader(self._vm.channel_fd)
            self._fail(GuestAgentError(f"guest agent broke the protocol: {exc}"))
            self.close()
            return
        for event in events:
            self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        kind = event.kind
        if event.kind == "eof":
            self._loop.remove_reader(self._vm.channel_fd)
            if not self._ready.done():
                # Before READY nothing was dispatched: QEMU failed to start (bad kernel or
                # image, too much memory, not QEMU at all). Its exit, due any moment, fails
                # the boot with VmTransientError and QEMU's own message from the console
                # socket; a QEMU that lingers is caught by the boot timeout.
                return
            self._fail(CommunicationOutcomeUnknownError("the channel to the guest was closed"))
            return
        exec_id = event.id
        if event.kind == "ready":
            if not self._ready.done():
                version = event.protocol_version
                if version != PROTOCOL_VERSION:
                    # Images built by another version of this library: nothing it would send
                    # could be trusted to mean the same. Retrying cannot help.
                    self._ready.set_exception(
                        VmPermanentError(
                            f"the guest agent speaks protocol version {version}, this library "
                            f"{PROTOCOL_VERSION}: rebuild the guest images (sbx setup)"
                        )
                    )
                else:
                    self._ready.set_result(None)
            return
        if exec_id in self._replies and (kind in _REPLY_KINDS or kind == "error"):
            reply = self._replies[exec_id]
            if not reply.done():
                reply.set_result(event)
            return
        if kind in ("proc_info", "proc_data"):
            # A request nobody waits for any more: one that timed out on the host, or one the
            # guest held for the host process before a pause or a fork.
            log.debug("event %s for unknown request %d ignored", kind, exec_id)
            return
        if kind in ("pong", "reseeded"):
            waiter = self._acks.get(exec_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if event.kind == "error" and exec_id in self._acks:
            waiter = self._acks[exec_id]
            if not waiter.done():
                waiter.set_exception(
                    GuestAgentError(f"guest agent error {event.code}: {event.message}")
                )
            return
        if kind.startswith("file_"):
            self._dispatch_file(kind, exec_id, event)
            return
        run = self._runs.get(exec_id)
        if run is None:
            log.debug("event %s for unknown execution %d ignored", kind, exec_id)
            return
        if isinstance(event, OutputEvent):  # stdout, stderr (file_data went above)
            stream = run.stdout if kind == "stdout" else run.stderr
            limit = run.limits[0] if kind == "stdout" else run.limits[1]
            # The guest enforces the limit; a guest that ignores it is cut off here.
            if stream.byte_count + len(event.data) > limit:
                self._complete(run, GuestAgentError(f"guest sent more {kind} than its limit"))
                self.close()
                return
            stream.feed(event.data)
        elif event.kind == "exit":
            self._complete(run, (event.exit_code, event.flags, event.duration_us))
        elif event.kind == "error":
            self._complete(run, GuestAgentError(f"guest agent error {event.code}: {event.message}"))
        elif event.kind == "output":
            broken = run.outputs.feed(event.flags, event.mime_type, event.data)
            if broken is not None:
                self._complete(run, GuestAgentError(f"guest broke the output protocol: {broken}"))
                self.close()
        elif event.kind == "tool_call":
            if len(run.calls) >= TOOL_CALLS_MAX:
                self._complete(run, GuestAgentError("guest made too many tool calls at once"))
                self.close()
                return
            task = self._loop.create_task(
                self._serve_call(exec_id, run, event.call, event.name, event.arguments)
            )
            run.calls[task] = (event.name, event.arguments, time.monotonic())
            task.add_done_callback(lambda done: run.calls.pop(done, None))

    async def _serve_call(
        self, exec_id: int, run: Execution, call: int, name: str, arguments: bytes
    ) -> None:
        """One TOOL_CALL: run the tool, log it on the execution, answer with TOOL_RESULT. The
        guest pip's installs go to the session's installer and are not in the call log."""
        if name == INSTALL_TOOL:
            status = TOOL_OK
            if run.installer is None:
                body = json.dumps({"error": {"lines": [_NO_INSTALLS]}}).encode()
            else:
                body = await run.installer(arguments)
        else:
            if run.tools is None:
                message = (
                    "this sandbox has no host tools (pass tools={...} to run() or session(), "
                    "and again to Scheduler.resume() for a resumed session)"
                )
                status, body = TOOL_ERROR, message.encode()
                record = ToolCall(name, arguments.decode(errors="replace"), False, message, 0)
            else:
                status, body, record = await run.tools.call(name, arguments)
            run.log_call(record)
            if run.tool_calls_dropped == 1:
                log.warning(
                    "execution %d made more than %d tool calls: the later ones are not logged",
                    exec_id,
                    len(run.tool_calls),
                )
        if self._broken is not None or self._runs.get(exec_id) is not run:
            return  # the execution ended meanwhile: the guest has answered the code already
        # The guest frees the call's place once this result reaches it and may send the next
        # call at once, which the loop can read before this task's done callbacks run: counted
        # until then, that call would be a 17th and cost the VM.
        task = asyncio.current_task()
        if task is not None:
            run.calls.pop(task, None)
        try:
            pending = self._vm.send_tool_result(exec_id, call, status, body)
        except OSError:
            return  # the channel is gone: the execution fails on its own
        self._want_write(pending)

    def _dispatch_file(self, kind: str, transfer_id: int, event: Event) -> None:
        transfer = self._transfers.get(transfer_id)
        if transfer is None or transfer.done.done():
            log.debug("event %s for unknown transfer %d ignored", kind, transfer_id)
            return
        if event.kind == "file_done":
            transfer.done.set_result(event.total)
        elif event.kind == "file_error":
            transfer.done.set_exception(GuestFileError(event.code, event.message))
        elif isinstance(event, (OutputEvent, FileEntriesEvent)):
            # file_data: on_data(bytes); file_entries: on_entries(list[FileEntry]).
            sink: Callable[[Any], None] | None = (
                transfer.on_data if kind == "file_data" else transfer.on_entries
            )
            if sink is None:
                # The guest answered a request with the wrong kind of data: a lie costs the VM.
                self._fail(GuestAgentError(f"guest sent {kind} for a request that expects none"))
                self.close()
                return
            try:
                sink(event.data if isinstance(event, OutputEvent) else event.entries)
            except BaseException as exc:
                transfer.done.set_exception(exc)

    def _complete(self, run: Execution, outcome: tuple[int, int, int] | BaseException) -> None:
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
                warnings.warn(
                    f"on_boot_log callback raised {exc!r}; disabled", RuntimeWarning, stacklevel=1
                )
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
        self._fail(VmTransientError(f"QEMU exited with status {status}{self.console_hint()}"))

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
        for reply in list(self._replies.values()):
            if not reply.done():
                reply.set_exception(error)
                reply.exception()
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
