"""Paused sessions on disk (`Session.pause()` / `Scheduler.resume(id)`, docs/design.md).

```
<memory_snapshot_cache_dir>/sessions/<id>/   state (QEMU's full migration stream: device state
                                             and RAM, the REPL and /home/user included),
                                             meta.json (identity, session settings, SHA-256),
                                             layer (its package layer's image, when it had one)
                                             disk (its work disk: /home/user and /tmp)
                                             disk.base (a forked session's: the frozen disk
                                             beneath its overlay, `disk`)
                                   .build-*/ a pause in progress (renamed to <id> when complete)
```

Owner-only (0700 directories, 0600 files; a frozen disk is 0444, for the jailed QEMUs that share
it, behind the 0700 directory): a snapshot holds the session's memory, so any secret
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

import contextlib
import functools
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .._threads import in_thread
from ..digest import fd_sha256, file_sha256
from ..errors import SnapshotError
from ..models import SessionSnapshot
from ..vm import workspace
from ..vm.spec import VmSpec
from ..vm.workspace import WorkDisk
from .ram import fd_digest

log = logging.getLogger("exec_sandbox")

SESSION_SNAPSHOT_FORMAT = 1
STATE_FILE = "state"
META_FILE = "meta.json"
LAYER_FILE = "layer"
DISK_FILE = "disk"
# A forked session's work disk is an overlay (DISK_FILE) on a frozen disk: this one.
DISK_BASE_FILE = "disk.base"
_ID = re.compile(r"[0-9a-f]{32}")
_STALE_BUILD_SECONDS = 3600.0


def check_id(snapshot_id: object) -> str:
    if isinstance(snapshot_id, SessionSnapshot):
        snapshot_id = snapshot_id.id
    if not isinstance(snapshot_id, str) or not _ID.fullmatch(snapshot_id):
        raise SnapshotError(f"not a session snapshot id: {str(snapshot_id)[:80]!r}")
    return snapshot_id


class SessionSnapshotStore:
    """The paused sessions of one cache directory. Its disk work (hashing RAM-sized state files,
    removing them) runs in executor threads: every public method is a coroutine that leaves the
    event loop free while it waits; the `_`-prefixed blocking steps run in those threads."""

    def __init__(self, root: Path, ttl_seconds: float, max_bytes: int) -> None:
        self.root = root
        self.ttl_seconds = ttl_seconds
        self.max_bytes = max_bytes

    @contextlib.asynccontextmanager
    async def build_dir(self) -> AsyncIterator[Path]:
        """A private directory for one save; removed unless published."""
        path = await in_thread(self._new_build, discard=_remove_tree)
        try:
            yield path
        finally:
            await in_thread(functools.partial(_remove_tree, path))

    async def publish(self, build: Path, meta: dict[str, Any]) -> SessionSnapshot:
        """Make build the snapshot meta describes, then evict what the cap and TTL allow."""
        return await in_thread(functools.partial(self._publish, build, meta))

    async def load(self, snapshot_id: str) -> dict[str, Any]:
        """The meta of a snapshot (its directory's mtime refreshed: it was used)."""
        return await in_thread(functools.partial(self._load, snapshot_id))

    async def layer_copy(self, snapshot_id: str, meta: dict[str, Any]) -> Path | None:
        """The snapshot's own copy of its package layer if it is the image recorded at the
        pause (size and SHA-256), else None."""
        return await in_thread(functools.partial(self._layer_copy, snapshot_id, meta))

    async def open_verified(self, snapshot_id: str, meta: dict[str, Any]) -> int:
        """An fd of the state, checked against the digest saved with it. The caller hands
        QEMU this very file (/proc/self/fd/N) and closes the fd: what was checked is what is
        loaded, whatever happens to the path meanwhile."""
        return await in_thread(
            functools.partial(self._open_verified, snapshot_id, meta), discard=os.close
        )

    async def disk_copy(
        self, snapshot_id: str, meta: dict[str, Any], spec: VmSpec
    ) -> WorkDisk | None:
        """A new work disk for the resumed VM: a copy of the snapshot's (which may be resumed
        again), checked against the size and digest recorded at the pause. None when the
        session had none."""
        if not meta.get("disk"):
            return None
        if spec.disk_dir is None or not spec.disk_mb:
            raise SnapshotError(f"session snapshot {snapshot_id} has a work disk, the VM none")
        saved = await in_thread(
            functools.partial(self._open_disk, snapshot_id, meta, spec.disk_mb),
            discard=WorkDisk.close,
        )
        try:
            # A snapshot resumes more than once: its files stay as they are. The overlay is
            # copied; the frozen disk beneath is shared, as a fork's copies share it.
            return await workspace.derived(spec.disk_dir, saved)
        finally:
            saved.close()

    async def entries(self) -> list[SessionSnapshot]:
        """Every snapshot (none past its TTL), oldest first."""
        return await in_thread(self._entries)

    async def delete(self, snapshot_id: str) -> bool:
        """Remove a snapshot; False when there was none of that id."""
        return await in_thread(functools.partial(self._delete, check_id(snapshot_id)))

    # --- the blocking steps, run in executor threads ---

    def _ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        return self.root

    def _new_build(self) -> Path:
        root = self._ensure_root()
        self._remove_stale_builds()
        return Path(tempfile.mkdtemp(prefix=".build-", dir=root))

    def _publish(self, build: Path, meta: dict[str, Any]) -> SessionSnapshot:
        snapshot_id = meta["id"]
        _write_private_json(build / META_FILE, meta)
        os.rename(build, self.root / snapshot_id)
        self._evict(keep=snapshot_id)
        return describe(meta)

    def _load(self, snapshot_id: str) -> dict[str, Any]:
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
            self._delete(snapshot_id)
            raise SnapshotError(
                f"session snapshot {snapshot_id} expired (unused for longer "
                f"than session_snapshot_ttl_seconds) and was deleted"
            )
        with contextlib.suppress(OSError):
            os.utime(directory)
        checked: dict[str, Any] = meta
        return checked

    def state_path(self, snapshot_id: str) -> Path:
        return self.root / check_id(snapshot_id) / STATE_FILE

    def _layer_copy(self, snapshot_id: str, meta: dict[str, Any]) -> Path | None:
        saved = meta.get("layer") or {}
        path = self.root / check_id(snapshot_id) / LAYER_FILE
        try:
            if path.stat().st_size != saved.get("size"):
                return None
            return path if file_sha256(path) == saved.get("sha256") else None
        except OSError:
            return None

    def _open_verified(self, snapshot_id: str, meta: dict[str, Any]) -> int:
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

    def _open_disk(self, snapshot_id: str, meta: dict[str, Any], disk_mb: int) -> WorkDisk:
        """The snapshot's disk, read-only, checked against what the pause recorded: a raw one
        of disk_mb MB, or an overlay with its frozen disk (of that size) beneath."""
        saved = meta["disk"]
        base_saved = saved.get("base")
        directory = self.root / check_id(snapshot_id)
        base = None
        if base_saved is not None:
            base = WorkDisk(
                self._open_checked(snapshot_id, directory / DISK_BASE_FILE, base_saved, disk_mb),
                disk_mb,
            )
            base.frozen = True
        try:
            fd = self._open_checked(
                snapshot_id, directory / DISK_FILE, saved, None if base else disk_mb
            )
        except BaseException:
            if base is not None:
                base.close()
            raise
        return WorkDisk(fd, disk_mb, base=base)

    def _open_checked(
        self, snapshot_id: str, path: Path, saved: dict[str, Any], disk_mb: int | None
    ) -> int:
        """path, opened read-only, if its size (disk_mb MB when given) and digest are saved's."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SnapshotError(
                f"session snapshot {snapshot_id}'s disk is unreadable: {exc}"
            ) from None
        try:
            size = os.fstat(fd).st_size
            ok = (
                size == saved.get("size")
                and (disk_mb is None or size == disk_mb << 20)
                and fd_digest(fd) == saved.get("sha256")
            )
        except OSError as exc:
            os.close(fd)
            raise SnapshotError(
                f"session snapshot {snapshot_id}'s disk is unreadable: {exc}"
            ) from None
        if not ok:
            os.close(fd)
            raise SnapshotError(
                f"session snapshot {snapshot_id} is damaged (its work disk does not match the "
                f"size and digest recorded when it was saved): it is not loaded"
            )
        return fd

    def _entries(self) -> list[SessionSnapshot]:
        out: list[SessionSnapshot] = []
        if not self.root.is_dir():
            return out
        self._evict()  # none past its TTL is listed
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

    def _delete(self, snapshot_id: str) -> bool:
        directory = self.root / check_id(snapshot_id)
        trash = self.root / f".trash-{snapshot_id}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            directory.rename(trash)
        except FileNotFoundError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def _evict(self, keep: str | None = None) -> list[str]:
        """Delete snapshots past the TTL, then the least recently used beyond the size cap."""
        entries = []
        for directory in self.root.glob("*"):
            if not _ID.fullmatch(directory.name):
                continue
            try:
                entries.append(
                    (
                        directory.stat().st_mtime,
                        (directory / STATE_FILE).stat().st_size
                        + _allocated(directory / DISK_FILE)
                        + _allocated(directory / DISK_BASE_FILE),
                        directory.name,
                    )
                )
            except OSError:
                continue
        now = time.time()
        removed = []
        total = sum(size for _, size, _ in entries)
        for used, size, name in sorted(entries):
            if name == keep:
                continue
            if now - used > self.ttl_seconds or total > self.max_bytes:
                log.info(
                    "session snapshot %s removed (%s)",
                    name,
                    "past its TTL" if now - used > self.ttl_seconds else "cache over its cap",
                )
                self._delete(name)
                removed.append(name)
                total -= size
        return removed

    def _remove_stale_builds(self) -> None:
        now = time.time()
        for path in [*self.root.glob(".build-*"), *self.root.glob(".trash-*")]:
            with contextlib.suppress(OSError):
                if (
                    path.name.startswith(".trash-")
                    or now - path.stat().st_mtime > _STALE_BUILD_SECONDS
                ):
                    shutil.rmtree(path, ignore_errors=True)


def _allocated(path: Path) -> int:
    """The bytes a sparse file takes on disk (0 if absent): what a work disk costs the cap."""
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _well_formed(meta: object) -> bool:
    """The fields resume() uses, of the types it uses them as (meta.json is not covered by the
    state's digest)."""
    if not isinstance(meta, dict) or meta.get("format") != SESSION_SNAPSHOT_FORMAT:
        return False
    session, machine, layer = meta.get("session"), meta.get("machine"), meta.get("layer")
    return (
        isinstance(meta.get("id"), str)
        and bool(_ID.fullmatch(meta["id"]))
        and meta.get("language") in ("python", "javascript", "raw")
        and all(isinstance(meta.get(k), (int, float)) for k in ("created", "size"))
        and isinstance(meta.get("sha256"), str)
        and isinstance(machine, dict)
        and isinstance(machine.get("memory_mb"), int)
        and isinstance(session, dict)
        and isinstance(session.get("timeout"), (int, float))
        and isinstance(session.get("exec_count"), int)
        and isinstance(session.get("env"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in session["env"].items())
        and (
            layer is None
            or (
                isinstance(layer, dict)
                and isinstance(layer.get("key"), str)
                and layer.get("kind") in ("python", "javascript")
            )
        )
        and isinstance(meta.get("packages", []), list)
        and (
            meta.get("disk") is None
            or (
                isinstance(meta["disk"], dict)
                and isinstance(meta["disk"].get("size"), int)
                and isinstance(meta["disk"].get("sha256"), str)
                and (
                    meta["disk"].get("base") is None
                    or (
                        isinstance(meta["disk"]["base"], dict)
                        and isinstance(meta["disk"]["base"].get("size"), int)
                        and isinstance(meta["disk"]["base"].get("sha256"), str)
                    )
                )
            )
        )
    )


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
