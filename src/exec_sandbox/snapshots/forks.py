"""A session's live VM state: saved into a paused-session snapshot (`save_session`, for
`Session.pause()`), loaded back (`load_vm`, for `Scheduler.resume()`) and copied into new VMs
(`fork_vms`, for `Session.fork()`). The snapshots themselves are kept by sessions.py."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._futures import retrieve
from .._threads import in_thread
from ..digest import file_sha256
from ..errors import SnapshotError
from ..models import SessionSnapshot
from ..vm import migration, workspace
from ..vm.binding import DISKS_MAX
from ..vm.guest import GuestVm
from ..vm.qmp import QmpClient
from ..vm.registry import VmRegistry
from ..vm.spec import VmSpec
from ..vm.workspace import WorkDisk
from .identity import machine_identity
from .ram import fd_digest, seal_against_changes
from .sessions import (
    DISK_BASE_FILE,
    DISK_FILE,
    LAYER_FILE,
    SESSION_SNAPSHOT_FORMAT,
    STATE_FILE,
    SessionSnapshotStore,
)

log = logging.getLogger("exec_sandbox")


class StepTimer:
    """Durations of a fork's steps, logged at DEBUG (bench/session_snapshots.py prints them)."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self._last = time.monotonic()

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append((step, now - self._last))
        self._last = now

    def note(self, step: str, seconds: float) -> None:
        """A part of the last step, measured by the callee."""
        self.steps.append((step, seconds))

    def log(self, what: str) -> None:
        log.debug(
            "%s steps: %s",
            what,
            "; ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in self.steps),
        )


async def save_session(
    vm: GuestVm, store: SessionSnapshotStore, meta: dict[str, Any]
) -> SessionSnapshot:
    """Stop vm and write its whole state into a new snapshot described by meta (language,
    session settings, layer; id, size, digest and machine are filled in here). The VM stays
    stopped: the caller closes it (pause), or runs it on (cont) only if this failed: a
    published snapshot's work disk is the VM's own file, given a name."""
    async with store.build_dir() as build:
        layer = vm.spec.layer
        if layer is not None and (meta.get("layer") or {}).get("sha256"):
            await asyncio.to_thread(_keep_layer, layer.path, build)
        state = build / STATE_FILE
        await migration.save_state(vm, str(state))
        size, digest = await asyncio.to_thread(lambda: (state.stat().st_size, file_sha256(state)))
        work = vm.spec.work
        if work is not None:  # stopped by the save, its writes flushed: the disk as saved
            meta = {**meta, "disk": await asyncio.to_thread(_keep_disk, work, build)}
        full = {
            **meta,
            "format": SESSION_SNAPSHOT_FORMAT,
            "id": uuid.uuid4().hex,
            "created": time.time(),
            "size": size,
            "sha256": digest,
            "machine": machine_identity(vm.spec),
        }
        return await store.publish(build, full)


def _keep_disk(work: WorkDisk, build: Path) -> dict[str, object]:
    """The session's work disk as the snapshot's own file (a link, no copy), with its size and
    digest, which resume() checks before it copies it; a forked session's overlay with the
    frozen disk beneath it, linked and recorded the same way."""
    work.link(build / DISK_FILE)
    saved: dict[str, object] = {
        "size": os.fstat(work.fd).st_size,
        "size_mb": work.size_mb,
        "sha256": fd_digest(work.fd),
    }
    if work.base is not None:
        work.base.link(build / DISK_BASE_FILE)
        saved["base"] = {"size": os.fstat(work.base.fd).st_size, "sha256": fd_digest(work.base.fd)}
    return saved


def _keep_layer(image: Path, build: Path) -> None:
    """A snapshot's own reference to its layer image; without one, resume() needs the cache's."""
    try:
        os.link(image, build / LAYER_FILE)
    except FileNotFoundError:
        log.warning(
            "package layer %s left the cache during the pause: the snapshot resumes only "
            "while the cache has it again",
            image,
        )
    except OSError:  # another file system: a private copy (hard links share the cache's mode)
        shutil.copyfile(image, build / LAYER_FILE)
        os.chmod(build / LAYER_FILE, 0o600)


def check_machine(meta: dict[str, Any], spec: VmSpec) -> None:
    """SnapshotError unless the snapshot's machine is the one spec would start."""
    saved = meta.get("machine") or {}
    current = machine_identity(spec)
    # Both ways: a key only the saved machine has (a network port) is a device this one lacks.
    different = sorted(k for k in current.keys() | saved.keys() if saved.get(k) != current.get(k))
    if different:
        raise SnapshotError(
            f"session snapshot {meta.get('id')} was taken on another machine configuration "
            f"({', '.join(different)} differ: e.g. other guest images or QEMU): it cannot be "
            f"resumed here"
        )


async def load_vm(
    spec: VmSpec,
    state: str,
    *,
    registry: VmRegistry | None,
    timeout: float,
    disk: WorkDisk | None = None,
) -> GuestVm:
    """A running VM from a full state file: its RAM anonymous, its RNG reseeded and clock set
    before this returns. disk: its work disk (a copy of the snapshot's), which it owns from
    here on, also if this fails."""
    try:
        return await migration.restore(
            replace(spec, mem_fd=None, mem_shared=False, mem_path=None, work=disk),
            state,
            registry=registry,
            timeout=timeout,
            ram_in_stream=True,
        )
    except BaseException:
        if disk is not None:
            disk.close()  # idempotent: the VM's close() may have done it
        raise


async def fork_vms(vm: GuestVm, count: int, work: Path, *, timeout: float) -> list[GuestVm]:
    """count copies of a running vm, which runs on (RESEEDed: its clock stood still). Its state
    is streamed QEMU to QEMU (migration.transfer: no file; the new QEMU starts while vm still
    runs, vm stops only for the stream). Each copy is RESEEDed before it runs anything.

    One copy gets the stream straight into private RAM, as a resumed session does: it would
    share no page with anyone (the parent's RAM is anonymous), so a template would only add
    its RAM size and a second load. Several copies share one template: the stream goes into a
    VM whose RAM is a shared memfd, stopped, whose device state alone is saved again; that
    memfd, sealed, is a template like an L1 one, and the copies are its copy-on-write clones,
    sharing every page none of them has written."""
    if count == 1:
        return [await _fork_one(vm, timeout=timeout)]
    return await _fork_many(vm, count, work, timeout=timeout)


async def _fork_one(vm: GuestVm, *, timeout: float) -> GuestVm:
    steps = StepTimer()
    split = await _split_disk(vm, 1)
    steps.mark("overlays")
    # The copy's disk: an overlay on the parent's raw disk, which the parent leaves for an
    # overlay of its own once stopped (split); else a disk the parent's is copied into once
    # stopped (see _disk_for_copy).
    copy_disk = split.copies[0] if split is not None else await _disk_for_copy(vm)
    private = replace(vm.spec, mem_fd=None, mem_shared=False, mem_path=None, work=copy_disk)
    try:
        copy = await migration.transfer(  # on failure vm runs on
            vm, private, timeout=timeout, on_stopped=None if split is None else split.move_parent
        )
    except BaseException:
        if split is not None:
            split.close()
        elif copy_disk is not None and not copy_disk.claimed:
            copy_disk.close()
        raise
    steps.mark("spawn+stream into copy")
    steps.note("(of which stream)", copy.restore_seconds)
    if split is None and vm.spec.work is not None and copy.spec.work is not None:
        try:
            # The parent is stopped, its writes flushed by the stream's end: its disk is the
            # one the copied RAM (page cache included) goes with.
            await asyncio.to_thread(workspace.copy_into, vm.spec.work, copy.spec.work)
        except BaseException:
            await copy.aclose()
            await _settled(asyncio.ensure_future(_run_on(vm)))
            raise
        steps.mark("disk copy")
    parent = asyncio.ensure_future(_run_on(vm))
    try:
        await migration.start(copy)
    except BaseException:
        copy.close()
        await asyncio.wait({parent})
        retrieve(parent)
        raise
    steps.mark("copy cont+reseed")
    try:
        await _settled(parent)
    except BaseException:
        await copy.aclose()
        raise
    steps.mark("parent cont+reseed")
    steps.log("fork(1)")
    return copy


async def _fork_many(vm: GuestVm, count: int, work: Path, *, timeout: float) -> list[GuestVm]:
    steps = StepTimer()
    split = await _split_disk(vm, count)
    steps.mark("overlays")
    frozen: WorkDisk | None = None
    try:
        ram = migration.ram_memfd(vm.spec.memory_mb)
    except BaseException:
        if split is not None:
            split.close()
        raise
    try:
        # work=None: the maker gets an empty disk it never uses (it only saves devices).
        spec = replace(vm.spec, mem_fd=ram, mem_path=None, work=None)
        maker = await migration.transfer(
            vm,
            replace(spec, mem_shared=True),
            timeout=timeout,
            on_stopped=None if split is None else split.move_parent,
        )
        steps.mark("spawn+stream into maker")
        steps.note("(of which stream)", maker.restore_seconds)
        if split is None and vm.spec.work is not None and vm.spec.disk_dir is not None:
            # The parent's disk as the stream left it, once, before the parent runs on; each
            # copy gets a copy of this one.
            try:
                frozen = await workspace.derived(vm.spec.disk_dir, vm.spec.work)
            except BaseException:
                await maker.aclose()
                await _settled(asyncio.ensure_future(_run_on(vm)))
                raise
            steps.mark("disk copy")
        parent = asyncio.ensure_future(_run_on(vm))  # while the template is made

        async def disk_of(index: int) -> WorkDisk | None:
            if split is not None:
                return split.copies[index]
            if frozen is None or vm.spec.disk_dir is None:
                return None
            return await workspace.derived(vm.spec.disk_dir, frozen)

        try:
            copies = await _clones(maker, ram, spec, count, work, timeout, steps, disk_of)
        except BaseException:
            await asyncio.wait({parent})
            retrieve(parent)
            raise
    finally:
        os.close(ram)
        if frozen is not None:
            frozen.close()
        if split is not None:
            split.close()
    try:
        await _settled(parent)
    except BaseException:
        for copy in copies:
            await copy.aclose()
        raise
    steps.mark("parent cont+reseed")
    steps.log(f"fork({count})")
    return copies


class _Split:
    """A fork's work disks when the parent's is raw: an overlay for the parent to move onto
    (move_parent, at its stop) and one per copy, all on the parent's disk, which is frozen from
    then on. close(): those not handed over yet."""

    def __init__(self, vm: GuestVm, parent: WorkDisk, copies: list[WorkDisk]) -> None:
        self.vm = vm
        self.parent = parent
        self.copies = copies
        self.moved = False

    async def move_parent(self, qmp: QmpClient) -> None:
        """The parent's QEMU, stopped, writes its overlay from now on (its old disk, beneath,
        is read-only to it). On failure it writes its old disk still, which is then not
        frozen."""
        old = self.vm.spec.work
        assert old is not None
        index = [d.kind for d in self.vm.spec.disks()].index(workspace.WORK_DISK_KIND)
        node = f"work-{uuid.uuid4().hex[:12]}"
        try:
            added = await qmp.execute("add-fd", {}, fds=[self.parent.fd])
            fdset = int(added["fdset-id"])
            await qmp.execute(
                "blockdev-add",
                {
                    "driver": "qcow2",
                    "node-name": node,
                    "discard": "unmap",
                    "backing": None,
                    "file": {
                        "driver": "file",
                        "filename": f"/dev/fdset/{fdset}",
                        "locking": "off",
                        "discard": "unmap",
                    },
                },
            )
            await qmp.execute("blockdev-snapshot", {"node": f"disk{index}", "overlay": node})
        except BaseException:
            workspace.thaw(old)
            raise
        self.vm.spec = replace(self.vm.spec, work=self.parent)
        self.parent.claimed = True
        self.moved = True
        old.close()  # the overlays hold their own fds of it

    def close(self) -> None:
        if not self.moved:
            self.parent.close()
            if self.vm.spec.work is not None:
                workspace.thaw(self.vm.spec.work)
        for disk in self.copies:
            if not disk.claimed:
                disk.close()


async def _split_disk(vm: GuestVm, count: int) -> _Split | None:
    """Overlays for a fork of vm (see _Split); None when vm has no raw work disk, or forks copy
    disks (no qemu-img, or no disk slot left for the frozen disk beneath the overlays)."""
    disk = vm.spec.work
    directory = vm.spec.disk_dir
    if disk is None or disk.overlay or directory is None or not workspace.overlays_available():
        return None
    if len(vm.spec.disks()) >= DISKS_MAX:
        return None
    workspace.freeze(disk)  # from the parent's stop on; thawed if the fork fails before that
    made: list[WorkDisk] = []
    try:
        for _ in range(count + 1):
            made.append(await workspace.derived(directory, disk))
    except BaseException:
        for overlay in made:
            overlay.close()
        workspace.thaw(disk)
        raise
    return _Split(vm, made[0], made[1:])


async def _disk_for_copy(vm: GuestVm) -> WorkDisk | None:
    """A disk for a fork's copy that the parent's disk is copied into once the parent is
    stopped (workspace.copy_into): None (GuestVm.spawn makes an empty raw one) for a raw disk;
    an empty overlay on the same frozen disk for an overlay (QEMU re-reads it when the copy
    takes it over at the stream's end: a migration's destination reads nothing before)."""
    disk = vm.spec.work
    if disk is None or disk.base is None or vm.spec.disk_dir is None:
        return None
    return await workspace.derived(vm.spec.disk_dir, disk.base)


async def _run_on(vm: GuestVm) -> None:
    """The parent runs again after the stream, RESEEDed: its clock stood still meanwhile."""
    await migration.cont(vm)
    await vm.reseed()


async def _clones(
    maker: GuestVm,
    ram: int,
    spec: VmSpec,
    count: int,
    work: Path,
    timeout: float,
    steps: StepTimer,
    disk_of: Callable[[int], Awaitable[WorkDisk | None]],
) -> list[GuestVm]:
    """count copy-on-write clones of maker (stopped, its RAM the shared memfd ram); maker is
    gone when this returns, and so is every clone if it raises."""
    # The memfd's holes are allocated, as for L1 templates (snapshots._sealed_copy): a copy's
    # fault on a hole would otherwise allocate the page in this shared file too, charged twice.
    # Filling holes changes no byte, so it runs while the maker saves its devices and ends.
    fill = asyncio.get_running_loop().run_in_executor(
        None, os.posix_fallocate, ram, 0, spec.memory_mb * 1024 * 1024
    )
    try:
        try:
            await migration.save_devices(maker, str(work / "devices"))
            steps.mark("maker device save")
        finally:
            await maker.aclose()
            steps.mark("maker close")
    finally:
        await asyncio.wait({fill})  # the thread uses ram, which the caller closes
    fill.result()
    steps.mark("fallocate (rest)")
    # The maker is reaped: nothing maps the memfd writably, so it can be sealed.
    await in_thread(functools.partial(seal_against_changes, ram))
    tasks = [
        asyncio.ensure_future(
            _clone(
                replace(spec, mem_shared=False), str(work / "devices"), maker, timeout, disk_of(i)
            )
        )
        for i in range(count)
    ]
    try:
        copies = list(await asyncio.gather(*tasks))
    except BaseException:
        # One failed, or the caller was cancelled: no copy may outlive this call.
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is None:
                await task.result().aclose()
        raise
    steps.mark("clones spawn+load+reseed")
    return copies


async def _clone(
    spec: VmSpec,
    devices: str,
    maker: GuestVm,
    timeout: float,
    disk: Awaitable[WorkDisk | None],
) -> GuestVm:
    """One copy of a fork template, on its own disk (an overlay on the parent's frozen one, or
    a copy of it)."""
    own = await disk
    try:
        return await migration.restore(
            replace(spec, work=own), devices, registry=maker.registry, timeout=timeout
        )
    except BaseException:
        if own is not None:
            own.close()  # idempotent: the VM's close() may have done it
        raise


async def _settled(task: asyncio.Future[None]) -> None:
    """task's outcome; a cancellation of the caller waits for task to end (the parent's cont
    and RESEED are not cut short) and is raised then."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        retrieve(task)
        raise
