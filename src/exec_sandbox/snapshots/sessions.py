"""Paused sessions on disk (`Session.pause()` / `Scheduler.resume(id)`, docs/design.md).

```
<memory_snapshot_cache_dir>/sessions/<id>/   state (QEMU's full migration stream: device state
                                             and RAM, the REPL and /home/user included),
                                             meta.json (identity, session settings, SHA-256),
                                             layer (its package layer's image, when it had one)
                                   .build-*/ a pause in progress (renamed to <id> when complete)
```

Owner-only (0700 directories, 0600 files): a snapshot holds the session's memory, so any secret
its code touched. A snapshot is complete or absent (published by rename), checked against its
SHA-256 before it is loaded, and refused with SnapshotError when the images, QEMU, accelerator or
its package layer differ from the scheduler's (a migration stream only loads into the same
machine). Snapshots older than the TTL go, and the least recently used ones beyond the size cap.

A session's package layer is a disk its guest has mounted: the resumed VM needs that very image
again, byte for byte, and a rebuild from the same package list may resolve other versions. So a
snapshot keeps its own hard link to the layer (a copy across file systems): the package cache
can evict the layer and the snapshot still resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..vm import migration
from ..vm.guest import GuestVm
from ..vm.spec import VmSpec
from ..digest import fd_sha256, file_sha256
from ..errors import SnapshotError
from ..models import SessionSnapshot
from .l1 import machine_identity
from ..vm.registry import VmRegistry

log = logging.getLogger("exec_sandbox")

SESSION_SNAPSHOT_FORMAT = 1
STATE_FILE = "state"
META_FILE = "meta.json"
LAYER_FILE = "layer"
_ID = re.compile(r"[0-9a-f]{32}")
_STALE_BUILD_SECONDS = 3600.0


def check_id(snapshot_id: object) -> str:
    if isinstance(snapshot_id, SessionSnapshot):
        snapshot_id = snapshot_id.id
    if not isinstance(snapshot_id, str) or not _ID.fullmatch(snapshot_id):
        raise SnapshotError(f"not a session snapshot id: {str(snapshot_id)[:80]!r}")
    return snapshot_id


class SessionSnapshotStore:
    def __init__(self, root: Path, ttl_seconds: float, max_bytes: int) -> None:
        self.root = root
        self.ttl_seconds = ttl_seconds
        self.max_bytes = max_bytes

    def _ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        return self.root

    @contextlib.contextmanager
    def build_dir(self) -> Iterator[Path]:
        """A private directory for one save; removed unless published."""
        root = self._ensure_root()
        self._remove_stale_builds()
        path = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def publish(self, build: Path, meta: dict[str, Any]) -> SessionSnapshot:
        snapshot_id = meta["id"]
        _write_private_json(build / META_FILE, meta)
        os.rename(build, self.root / snapshot_id)
        self.evict(keep=snapshot_id)
        return describe(meta)

    def load(self, snapshot_id: str) -> dict[str, Any]:
        """The meta of a snapshot (its directory's mtime refreshed: it was used)."""
        directory = self.root / check_id(snapshot_id)
        try:
            meta = json.loads((directory / META_FILE).read_text())
        except FileNotFoundError:
            raise SnapshotError(f"no session snapshot {snapshot_id} in {self.root}") from None
        except (OSError, ValueError) as exc:
            raise SnapshotError(f"session snapshot {snapshot_id} is unreadable: {exc}") from None
        if not _well_formed(meta) or meta["id"] != snapshot_id:
            raise SnapshotError(f"session snapshot {snapshot_id} has an unknown format")
        if time.time() - directory.stat().st_mtime > self.ttl_seconds:
            self.delete(snapshot_id)
            raise SnapshotError(f"session snapshot {snapshot_id} expired (unused for longer "
                                f"than session_snapshot_ttl_seconds) and was deleted")  # fmt: skip
        with contextlib.suppress(OSError):
            os.utime(directory)
        checked: dict[str, Any] = meta
        return checked

    def state_path(self, snapshot_id: str) -> Path:
        return self.root / check_id(snapshot_id) / STATE_FILE

    def layer_copy(self, snapshot_id: str, meta: dict[str, Any]) -> Path | None:
        """The snapshot's own copy of its package layer if it is the image recorded at the pause
        (size and SHA-256; blocking: run it in a thread), else None."""
        saved = meta.get("layer") or {}
        path = self.root / check_id(snapshot_id) / LAYER_FILE
        try:
            if path.stat().st_size != saved.get("size"):
                return None
            return path if file_sha256(path) == saved.get("sha256") else None
        except OSError:
            return None

    def open_verified(self, snapshot_id: str, meta: dict[str, Any]) -> int:
        """An fd of the state, checked against the digest saved with it (blocking: run it in a
        thread). The caller hands QEMU this very file (/proc/self/fd/N) and closes the fd:
        what was checked is what is loaded, whatever happens to the path meanwhile."""
        try:
            fd = os.open(self.state_path(snapshot_id), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SnapshotError(f"session snapshot {snapshot_id} is unreadable: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            digest = fd_sha256(fd) if size == meta.get("size") else None
        except OSError as exc:
            os.close(fd)
            raise SnapshotError(f"session snapshot {snapshot_id} is unreadable: {exc}") from None
        if digest is None or digest != meta.get("sha256"):
            os.close(fd)
            raise SnapshotError(
                f"session snapshot {snapshot_id} is damaged (its state does not match the "
                f"digest recorded when it was saved): it is not loaded"
            )
        return fd

    def entries(self) -> list[SessionSnapshot]:
        out: list[SessionSnapshot] = []
        if not self.root.is_dir():
            return out
        self.evict()  # none past its TTL is listed
        for directory in self.root.iterdir():
            if not _ID.fullmatch(directory.name):
                continue
            try:
                meta = json.loads((directory / META_FILE).read_text())
            except (OSError, ValueError):
                continue
            if _well_formed(meta):
                out.append(describe(meta))
        return sorted(out, key=lambda s: s.created_at)

    def delete(self, snapshot_id: str) -> bool:
        directory = self.root / check_id(snapshot_id)
        trash = self.root / f".trash-{snapshot_id}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            directory.rename(trash)
        except FileNotFoundError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def evict(self, keep: str | None = None) -> list[str]:
        """Delete snapshots past the TTL, then the least recently used beyond the size cap."""
        entries = []
        for directory in self.root.glob("*"):
            if not _ID.fullmatch(directory.name):
                continue
            try:
                entries.append((directory.stat().st_mtime, (directory / STATE_FILE).stat().st_size,
                                directory.name))  # fmt: skip
            except OSError:
                continue
        now = time.time()
        removed = []
        total = sum(size for _, size, _ in entries)
        for used, size, name in sorted(entries):
            if name == keep:
                continue
            if now - used > self.ttl_seconds or total > self.max_bytes:
                log.info("session snapshot %s removed (%s)", name,
                         "past its TTL" if now - used > self.ttl_seconds else "cache over its cap")  # fmt: skip
                self.delete(name)
                removed.append(name)
                total -= size
        return removed

    def _remove_stale_builds(self) -> None:
        now = time.time()
        for path in [*self.root.glob(".build-*"), *self.root.glob(".trash-*")]:
            with contextlib.suppress(OSError):
                if path.name.startswith(".trash-") or now - path.stat().st_mtime > _STALE_BUILD_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)


def _well_formed(meta: object) -> bool:
    """The fields resume() uses, of the types it uses them as (meta.json is not covered by the
    state's digest)."""
    if not isinstance(meta, dict) or meta.get("format") != SESSION_SNAPSHOT_FORMAT:
        return False
    session, machine, layer = meta.get("session"), meta.get("machine"), meta.get("layer")
    return (
        isinstance(meta.get("id"), str) and bool(_ID.fullmatch(meta["id"]))
        and meta.get("language") in ("python", "javascript", "raw")
        and all(isinstance(meta.get(k), (int, float)) for k in ("created", "size"))
        and isinstance(meta.get("sha256"), str)
        and isinstance(machine, dict) and isinstance(machine.get("memory_mb"), int)
        and isinstance(session, dict) and isinstance(session.get("timeout"), (int, float))
        and isinstance(session.get("exec_count"), int) and isinstance(session.get("env"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in session["env"].items())
        and (layer is None or (isinstance(layer, dict) and isinstance(layer.get("key"), str)
                               and layer.get("kind") in ("python", "javascript")))
        and isinstance(meta.get("packages", []), list)
    )  # fmt: skip


def describe(meta: dict[str, Any]) -> SessionSnapshot:
    return SessionSnapshot(
        id=str(meta["id"]),
        language=meta["language"],
        memory_mb=int(meta["machine"]["memory_mb"]),
        created_at=float(meta["created"]),
        size_bytes=int(meta["size"]),
        exec_count=int(meta["session"]["exec_count"]),
        packages=tuple(meta.get("packages") or ()),
    )


def _write_private_json(path: Path, data: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, sort_keys=True)


# --- saving and loading a live VM's whole state ---


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
        log.debug("%s steps: %s", what, "; ".join(f"{name} {seconds * 1000:.0f} ms"
                                                  for name, seconds in self.steps))  # fmt: skip


async def save_session(vm: GuestVm, store: SessionSnapshotStore, meta: dict[str, Any]) -> SessionSnapshot:
    """Stop vm and write its whole state into a new snapshot described by meta (language,
    session settings, layer; id, size, digest and machine are filled in here). The VM stays
    stopped: the caller closes it (pause) or runs it on (cont)."""
    with store.build_dir() as build:
        layer = vm.spec.layer
        if layer is not None and (meta.get("layer") or {}).get("sha256"):
            await asyncio.get_running_loop().run_in_executor(None, _keep_layer, layer.path, build)
        state = build / STATE_FILE
        await migration.save_state(vm, str(state))
        size, digest = await asyncio.get_running_loop().run_in_executor(
            None, lambda: (state.stat().st_size, file_sha256(state))
        )
        full = {**meta, "format": SESSION_SNAPSHOT_FORMAT, "id": uuid.uuid4().hex,
                "created": time.time(), "size": size, "sha256": digest,
                "machine": machine_identity(vm.spec)}  # fmt: skip
        return store.publish(build, full)


def _keep_layer(image: Path, build: Path) -> None:
    """A snapshot's own reference to its layer image; without one, resume() needs the cache's."""
    try:
        os.link(image, build / LAYER_FILE)
    except FileNotFoundError:
        log.warning("package layer %s left the cache during the pause: the snapshot resumes only "
                    "while the cache has it again", image)  # fmt: skip
    except OSError:  # another file system: a private copy (hard links share the cache's mode)
        shutil.copyfile(image, build / LAYER_FILE)
        os.chmod(build / LAYER_FILE, 0o600)


def check_machine(meta: dict[str, Any], spec: VmSpec) -> None:
    """SnapshotError unless the snapshot's machine is the one spec would start."""
    saved = meta.get("machine") or {}
    current = machine_identity(spec)
    different = sorted(k for k in current if saved.get(k) != current[k])
    if different:
        raise SnapshotError(
            f"session snapshot {meta.get('id')} was taken on another machine configuration "
            f"({', '.join(different)} differ: e.g. other guest images or QEMU): it cannot be "
            f"resumed here"
        )


async def load_vm(spec: VmSpec, state: str, *, registry: VmRegistry | None,
                  timeout: float) -> GuestVm:  # fmt: skip
    """A running VM from a full state file: its RAM anonymous, its RNG reseeded and clock set
    before this returns."""
    return await migration.restore(replace(spec, mem_fd=None, mem_shared=False, mem_path=None),
                                   state, registry=registry, timeout=timeout,
                                   ram_in_stream=True)  # fmt: skip


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
    private = replace(vm.spec, mem_fd=None, mem_shared=False, mem_path=None)
    copy = await migration.transfer(vm, private, timeout=timeout)  # on failure vm runs on
    steps.mark("spawn+stream into copy")
    steps.note("(of which stream)", copy.restore_seconds)
    parent = asyncio.ensure_future(_run_on(vm))
    try:
        await migration.start(copy)
    except BaseException:
        copy.close()
        await asyncio.wait({parent})
        _retrieve(parent)
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
    ram = migration.ram_memfd(vm.spec.memory_mb)
    try:
        spec = replace(vm.spec, mem_fd=ram, mem_path=None)
        maker = await migration.transfer(vm, replace(spec, mem_shared=True), timeout=timeout)
        steps.mark("spawn+stream into maker")
        steps.note("(of which stream)", maker.restore_seconds)
        parent = asyncio.ensure_future(_run_on(vm))  # while the template is made
        try:
            copies = await _clones(maker, ram, spec, count, work, timeout, steps)
        except BaseException:
            await asyncio.wait({parent})
            _retrieve(parent)
            raise
    finally:
        os.close(ram)
    try:
        await _settled(parent)
    except BaseException:
        for copy in copies:
            await copy.aclose()
        raise
    steps.mark("parent cont+reseed")
    steps.log(f"fork({count})")
    return copies


async def _run_on(vm: GuestVm) -> None:
    """The parent runs again after the stream, RESEEDed: its clock stood still meanwhile."""
    await migration.cont(vm)
    await vm.reseed()


async def _clones(maker: GuestVm, ram: int, spec: VmSpec, count: int, work: Path,
                  timeout: float, steps: StepTimer) -> list[GuestVm]:  # fmt: skip
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
    fcntl.fcntl(ram, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK
                | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)  # fmt: skip
    tasks = [asyncio.ensure_future(migration.restore(replace(spec, mem_shared=False),
                                                     str(work / "devices"),
                                                     registry=maker.registry, timeout=timeout))
             for _ in range(count)]  # fmt: skip
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


async def _settled(task: asyncio.Future[None]) -> None:
    """task's outcome; a cancellation of the caller waits for task to end (the parent's cont
    and RESEED are not cut short) and is raised then."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        _retrieve(task)
        raise


def _retrieve(future: asyncio.Future[None]) -> None:
    """Consume a finished future's outcome (the error that matters is being raised)."""
    if not future.cancelled():
        future.exception()
