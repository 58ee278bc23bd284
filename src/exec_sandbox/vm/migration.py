"""Saving and loading a VM's state over QMP (QEMU's migration), for the snapshot code: L1
templates (`snapshots/l1.py`), paused and forked sessions (`snapshots/forks.py`).

Two kinds of stream: a device-state stream of a VM whose RAM is a shared file (x-ignore-shared:
the file is the snapshot's memory, the stream holds only device state, ~50 KB), and a full
stream, RAM included (a paused session). Streams go through a pipe the host drains into the file:
a jailed QEMU may not write files (RLIMIT_FSIZE 0) and cannot open one by path (read-only mounts).
A fork's full stream goes through a pipe from one QEMU straight into another (transfer()).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import Awaitable, Callable

from .._futures import retrieve
from ..errors import SnapshotError, VmTimeoutError
from .execution import OutputCallback
from .guest import GuestVm
from .qmp import QmpClient, QmpError
from .registry import VmRegistry
from .spec import VmSpec

# A device-state stream of these VMs is ~50 KB; anything far larger is not ours.
_STATE_MAX_BYTES = 64 * 1024 * 1024
_STATE_DRAIN_TIMEOUT_SECONDS = 30.0
_QMP_CONNECT_TIMEOUT_SECONDS = 10.0
_IGNORE_SHARED = {"capabilities": [{"capability": "x-ignore-shared", "state": True}]}
# migrate-set-parameters max-bandwidth (bytes/s): as fast as the host can write.
_UNCAPPED_BANDWIDTH = 1 << 40
# transfer()'s pipe: the most an unprivileged process may ask for (fs.pipe-max-size's default).
_PIPE_BYTES = 1 << 20


async def restore(
    spec: VmSpec,
    state_path: str,
    *,
    registry: VmRegistry | None,
    timeout: float,
    on_boot_log: OutputCallback | None = None,
    ram_in_stream: bool = False,
    run: bool = True,
) -> GuestVm:
    """Start a clone of a memory snapshot: QEMU maps spec.mem_path (the template's RAM)
    privately, loads the device state from state_path over QMP and resumes. The guest's
    RNG is reseeded before this returns, so nothing runs on the template's RNG state.

    ram_in_stream: state_path is a full stream (a paused session: RAM included), loaded
    into spec's RAM, which may then be a shared file (making a fork template). run=False
    leaves the VM stopped after the load (no cont, no RESEED): it is only saved again.

    Raises VmTransientError (or QmpError, VmTimeoutError) if the clone does not come up;
    the VM is gone then."""
    guest = await GuestVm.spawn(spec, registry=registry, incoming=True, on_boot_log=on_boot_log)
    try:
        await asyncio.wait_for(_load(guest, state_path, timeout, ram_in_stream, run), timeout)
    except TimeoutError:
        guest.close()
        raise VmTimeoutError(
            f"snapshot restore did not finish within {timeout:.0f} s{guest.console_hint()}"
        ) from None
    except BaseException:
        guest.close()
        raise
    return guest


async def _load(
    guest: GuestVm, state_path: str, timeout: float, ram_in_stream: bool, run: bool
) -> None:
    started = time.monotonic()
    guest.qmp = qmp = await QmpClient.connect(guest.qmp_fd, timeout)
    # A template's stream has no RAM (it is in the shared file); a full stream has it, and
    # a destination that ignores shared RAM would refuse pages for its shared file.
    if not ram_in_stream:
        await qmp.execute("migrate-set-capabilities", _IGNORE_SHARED)
    fd = os.open(state_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        await qmp.execute("getfd", {"fdname": "state"}, fds=[fd])
    finally:
        os.close(fd)  # QEMU holds its own copy now
    await qmp.execute("migrate-incoming", {"uri": "fd:state"})
    await _wait_migration(qmp)
    if not run:
        guest.restore_seconds = time.monotonic() - started
        return
    await qmp.execute("cont")
    guest.mark_running()
    running = time.monotonic()
    guest.restore_seconds = running - started
    await guest.reseed()
    guest.connect_seconds = time.monotonic() - running


# What transfer() runs with vm's monitor once vm is stopped, before the stream (a fork moving the
# parent onto a work disk overlay).
OnStopped = Callable[[QmpClient], Awaitable[None]]


async def transfer(
    vm: GuestVm, spec: VmSpec, *, timeout: float, on_stopped: OnStopped | None = None
) -> GuestVm:
    """A new VM (spec) holding vm's whole state, RAM included, streamed QEMU to QEMU through a
    pipe (a fork): no file is written or read, and the new QEMU starts while vm still runs, so
    vm stops only for the stream itself. On success both are stopped: the caller cont()s vm
    and start()s the new VM (RESEED before it runs anything) or saves it again. On any failure
    or cancellation the new VM is gone and vm runs on (or is ended, if it cannot).
    on_stopped: run once vm is stopped, before the stream; its failure fails the transfer."""
    task = asyncio.ensure_future(_transfer(vm, spec, timeout, on_stopped))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # Let the stream end rather than cut a QMP command short: its reply, left unread,
        # would answer the parent's next command. Then undo it.
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is None:
            # Reaped before this returns, as for any cancelled call: nothing of it runs on.
            await task.result().aclose()
            await _run_on(vm)
        raise


async def _transfer(
    vm: GuestVm, spec: VmSpec, timeout: float, on_stopped: OnStopped | None
) -> GuestVm:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # fewer switches between the two QEMUs; 64 KiB else
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    guest: GuestVm | None = None
    source_stopped = False
    try:
        # The copy has the source's owner: its close() ends both.
        guest = await GuestVm.spawn(spec, registry=vm.registry, incoming=True, on_boot_log=None)
        guest.qmp = await asyncio.wait_for(QmpClient.connect(guest.qmp_fd, timeout), timeout)
        fd, read_end = read_end, -1
        await _hand_fd(guest.qmp, fd)
        await guest.qmp.execute("migrate-incoming", {"uri": "fd:state"})
        qmp = await monitor(vm)
        await qmp.execute(
            "migrate-set-capabilities",
            {"capabilities": [{"capability": "x-ignore-shared", "state": False}]},
        )
        await qmp.execute("migrate-set-parameters", {"max-bandwidth": _UNCAPPED_BANDWIDTH})
        started = time.monotonic()
        source_stopped = True
        await qmp.execute("stop")
        if on_stopped is not None:
            await on_stopped(qmp)
        fd, write_end = write_end, -1
        await _hand_fd(qmp, fd)
        await qmp.execute("migrate", {"uri": "fd:state"})
        # One after the other, not gathered: a wait left polling a monitor after the other
        # failed would share that monitor with _run_on's commands.
        await asyncio.wait_for(_wait_migration(qmp), timeout)
        await asyncio.wait_for(_wait_migration(guest.qmp, incoming_pipe=True), timeout)
        guest.restore_seconds = time.monotonic() - started
        return guest
    except BaseException as exc:
        if guest is not None:
            guest.close()  # the source's stream breaks (EPIPE) if it was still sending
        if source_stopped and vm.alive:
            await _run_on(vm)
        if guest is not None:
            await guest.aclose()  # reaped before the failure is reported
        if not isinstance(exc, Exception):
            raise
        if isinstance(exc, asyncio.TimeoutError):
            raise SnapshotError(
                f"streaming the VM's state did not finish within {timeout:.0f} s"
            ) from None
        raise SnapshotError(f"streaming the VM's state failed: {exc}") from exc
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)


async def start(guest: GuestVm) -> None:
    """Run a VM made by transfer(): cont, then RESEED (fresh kernel RNG, the host's clock)
    before anything else is sent to it."""
    started = time.monotonic()
    await (await monitor(guest)).execute("cont")
    guest.mark_running()
    await guest.reseed()
    guest.connect_seconds = time.monotonic() - started


async def _hand_fd(qmp: QmpClient, fd: int) -> None:
    """Give QEMU its own copy of fd as "state" and close ours (EOF or EPIPE then follow the
    other QEMU's end alone)."""
    try:
        await qmp.execute("getfd", {"fdname": "state"}, fds=[fd])
    finally:
        os.close(fd)


async def _run_on(vm: GuestVm) -> None:
    """Cancel a migration out of vm and let it run again; end it if it cannot."""
    qmp = await monitor(vm)
    try:
        await asyncio.wait_for(qmp.execute("migrate_cancel"), _QMP_CONNECT_TIMEOUT_SECONDS)
    except Exception:
        pass
    try:
        await asyncio.wait_for(qmp.execute("cont"), _QMP_CONNECT_TIMEOUT_SECONDS)
    except Exception:
        vm.close()


async def save_devices(vm: GuestVm, state_path: str) -> None:
    """Stop vm and write its device state to state_path. Its RAM must be in a shared mem_path
    file (VmSpec.mem_shared): with x-ignore-shared the stream skips it, so saving costs
    milliseconds. The VM stays stopped; the caller destroys it."""
    await _save(vm, state_path, ram=False, limit=_STATE_MAX_BYTES)


async def save_state(vm: GuestVm, state_path: str) -> None:
    """Stop vm and write its whole state, RAM included, to state_path (a paused or forked
    session). The VM stays stopped: close() it, or cont() to go on running."""
    await _save(vm, state_path, ram=True, limit=vm.spec.memory_mb * 1024 * 1024 + _STATE_MAX_BYTES)


async def cont(vm: GuestVm) -> None:
    """Run a VM stopped by save_state() again (QEMU takes its disks back)."""
    await (await monitor(vm)).execute("cont")


async def monitor(vm: GuestVm) -> QmpClient:
    """The VM's QMP client, connected on first use (QEMU's greeting waits in the socket):
    not on the boot path, where a VM killed mid-boot must not leave a handshake waiting."""
    if vm.qmp is None:
        if vm.qmp_fd < 0:
            raise QmpError("this VM has no QMP monitor")
        vm.qmp = await QmpClient.connect(vm.qmp_fd, _QMP_CONNECT_TIMEOUT_SECONDS)
    return vm.qmp


def ram_memfd(memory_mb: int) -> int:
    """An empty memfd of the guest's RAM size, sealable: the RAM file of a fork template
    (snapshots/forks.py fork_vms). The caller closes it once the VMs mapping it are spawned
    (QEMU has its own copy)."""
    fd = os.memfd_create("sbx-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, memory_mb * 1024 * 1024)
    except BaseException:
        os.close(fd)
        raise
    return fd


async def _save(vm: GuestVm, state_path: str, *, ram: bool, limit: int) -> None:
    qmp = await monitor(vm)
    await qmp.execute(
        "migrate-set-capabilities",
        {"capabilities": [{"capability": "x-ignore-shared", "state": not ram}]},
    )
    if ram:
        # The default 128 MiB/s cap would make a 192 MiB guest's save take over a second.
        await qmp.execute("migrate-set-parameters", {"max-bandwidth": _UNCAPPED_BANDWIDTH})
    await qmp.execute("stop")
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    copier = asyncio.get_running_loop().run_in_executor(
        None, _drain_to_file, read_end, state_path, limit
    )
    try:
        try:
            await qmp.execute("getfd", {"fdname": "state"}, fds=[write_end])
        finally:
            os.close(write_end)  # QEMU holds its own copy; EOF once it closes that
        await qmp.execute("migrate", {"uri": "fd:state"})
        await _wait_migration(qmp)
        # QEMU closes its copy of the pipe when the migration has completed: EOF.
        await asyncio.wait_for(asyncio.shield(copier), _STATE_DRAIN_TIMEOUT_SECONDS)
    except asyncio.CancelledError:
        # The copier thread ends at EOF, once QEMU is gone: end both here, so that the
        # thread's files are closed before this returns.
        vm.close()
        await asyncio.wait({copier})
        retrieve(copier)
        raise
    except BaseException as exc:
        # The guest is intact, only stopped (a full disk, a stream over its limit, a failed
        # migration): cancel the migration, and give the VM its run back.
        await _abandon_save(vm, qmp, copier)
        raise SnapshotError(f"saving the VM's state failed: {exc}") from exc


async def _abandon_save(vm: GuestVm, qmp: QmpClient, copier: asyncio.Future[None]) -> None:
    try:
        await asyncio.wait_for(qmp.execute("migrate_cancel"), _QMP_CONNECT_TIMEOUT_SECONDS)
    except Exception:
        pass
    _done, pending = await asyncio.wait({copier}, timeout=_STATE_DRAIN_TIMEOUT_SECONDS)
    if pending:  # QEMU still holds the pipe: only its end ends the copier
        vm.close()
        await asyncio.wait({copier})
    retrieve(copier)
    if vm.alive:
        try:
            await asyncio.wait_for(qmp.execute("cont"), _QMP_CONNECT_TIMEOUT_SECONDS)
        except Exception:
            vm.close()


async def _wait_migration(qmp: QmpClient, *, incoming_pipe: bool = False) -> None:
    """Poll until the migration completed. incoming_pipe: the destination of transfer(), which
    reports no status until the stream's first bytes arrive (the caller bounds the wait)."""
    while True:
        info = await qmp.execute("query-migrate")
        status = info.get("status") if isinstance(info, dict) else None
        if status == "completed":
            return
        if status in ("failed", "cancelled") or (status is None and not incoming_pipe):
            detail = info.get("error-desc", "") if isinstance(info, dict) else ""
            raise QmpError(f"migration {status}: {str(detail)[:300]}")
        await asyncio.sleep(0.002)


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
