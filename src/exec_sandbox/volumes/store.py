"""The volumes of this host: a directory of sparse raw disk images and their records.

```
<name>.img    the disk: created empty (ftruncate, sparse), 0600; only guests read or write it
<name>.json   its record: {"name", "size_mb", "created_at"}, written after the image
.lock         flock: one create or delete at a time, across processes
claims/<id>.json  the read-only volumes of the paused session <id>, where they were mounted,
                  and the directory of its snapshot (a store of another cache checks that)
```

Attaching (`claim`) opens the image and takes an flock on that open file for as long as the VM
lives: LOCK_EX for read-write, LOCK_SH for read-only, never waiting (LOCK_NB). So a volume is
written by one VM at a time, and never read by one while another writes it (a guest's page
cache over a disk another guest changes would read garbage). The lock is the kernel's: it holds
across processes and goes with the fd when its holder dies. The VM gets the image as
/proc/self/fd/N of the locked fd, so what was locked is what QEMU opens, even if the name was
deleted and made again meanwhile. delete() takes LOCK_EX itself: refused while attached.

A paused session holds its (read-only) volumes' file systems mounted in its saved memory: while
its snapshot exists, the volumes must not change. Its claim (claims/<id>.json, written at the
pause while its VM still holds the locks) refuses read-write attaches and deletion; resume()
attaches the same volumes again from it. A claim whose snapshot is gone (deleted, expired) is
ignored and removed (`snapshot_exists`).

The host never reads an image's content (the guest formats and mounts it; docs/security.md).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._cache_dirs import write_json_atomically
from .._threads import in_thread
from ..errors import InputValidationError, VolumeError, VolumeInUseError
from .volume import (
    VOLUME_KINDS,
    Volume,
    VolumeAttach,
    VolumeMount,
    validate_volume_name,
    validate_volume_size,
    validate_volumes,
)

_RECORD_MAX_BYTES = 4096
_READER_TRIES = 5
_SNAPSHOT_ID = re.compile(r"[0-9a-f]{32}")  # snapshots/sessions.py's ids


@dataclass(eq=False)  # one VM's: compared and hashed by identity, as a VmSpec field
class VolumeClaims:
    """The locked images of one VM's volumes: hold it for the VM's life, close() after its QEMU
    is gone (idempotent). disks: (kind, /proc/self/fd path, writable) in VOLUME_KINDS order."""

    attaches: tuple[VolumeAttach, ...]
    fds: list[int] = field(default_factory=list)
    # Given to a VM (GuestVm.spawn): a second VM of the same spec (a fork's copy) takes its
    # own locks (share()), so that each VM releases only its own.
    given: bool = False
    _given: bool = field(default=False, init=False)  # give_to() ran: close() takes them back

    @property
    def read_write(self) -> bool:
        return any(not a.read_only for a in self.attaches)

    def disks(self) -> list[tuple[str, str, bool]]:
        return [
            (kind, f"/proc/self/fd/{fd}", not a.read_only)
            for kind, fd, a in zip(
                VOLUME_KINDS[: len(self.fds)], self.fds, self.attaches, strict=True
            )
        ]

    def share(self) -> VolumeClaims:
        """Locks of their own on the same read-only images, for another VM (a copy of a
        session): a new open file of each, LOCK_SH. VolumeError for read-write volumes (one
        VM alone may hold those), VolumeInUseError should a writer hold one meanwhile."""
        if self.read_write:
            raise VolumeError("a read-write volume cannot be attached to a second VM")
        other = VolumeClaims(self.attaches)
        try:
            for fd, attach in zip(self.fds, self.attaches, strict=True):
                own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
                other.fds.append(own)
                if not _try_lock(own, read_only=True):
                    raise VolumeInUseError(_in_use_message(own, attach))
        except BaseException:
            other.close()
            raise
        return other

    def give_to(self, uid: int, gid: int) -> None:
        """Open the images to the QEMU user (a root caller's QEMU runs as its own, vm/jail.py):
        QEMU reopens each by /proc/self/fd/N, which checks the file's owner and mode. A
        read-write image becomes that user's (the C core does the same for writable disks). A
        read-only one stays ours and is opened to QEMU's group for reading only (0640): a
        QEMU taken over by its guest can neither write it (the other readers' disk) nor, not
        being its owner, change its mode. close() takes them back."""
        self._given = True
        for fd, attach in zip(self.fds, self.attaches, strict=True):
            if attach.read_only:
                os.fchown(fd, os.geteuid(), gid)
                os.fchmod(fd, 0o640)
            else:
                os.fchown(fd, uid, gid)

    def close(self) -> None:
        fds, self.fds = self.fds, []
        given, self._given = self._given, False
        for fd, attach in zip(fds, self.attaches, strict=False):
            if given:
                _take_back(fd, attach.read_only)
            os.close(fd)  # releases its lock

    def __del__(self) -> None:
        self.close()


class VolumeStore:
    """The volumes of one directory (SchedulerConfig.volume_dir). The blocking methods do file
    system work; the coroutines run them in a thread. snapshot_exists(id): whether a paused
    session's snapshot still exists (its hold counts only then); None: every hold counts."""

    def __init__(self, root: Path, snapshot_exists: Callable[[str], bool] | None = None) -> None:
        self.root = root
        self._snapshot_exists = snapshot_exists
        # Where this store's paused sessions live (beside_sessions): written into each hold, so
        # that a store of another snapshot cache sharing this volume directory tells a live
        # hold from a stale one by the snapshot itself, not by its own cache.
        self._sessions: Path | None = None

    @classmethod
    def beside_sessions(cls, root: Path, sessions: Path) -> VolumeStore:
        """The store of root whose holds count while their snapshot's directory is in
        sessions (snapshots/sessions.py): the Scheduler's and the CLI's, one rule for both."""
        store = cls(root, lambda snapshot_id: (sessions / snapshot_id).is_dir())
        store._sessions = sessions.absolute()
        return store

    # --- coroutines for the scheduler ---

    async def create(self, name: str, size_mb: int | None) -> Volume:
        """The volume name, made at size_mb if there is none; size_mb None: only an existing
        one (VolumeError otherwise)."""
        name = validate_volume_name(name)
        if size_mb is None:
            volume = await in_thread(lambda: self.get_sync(name))
            if volume is None:
                raise VolumeError(f"no volume {name!r} in {self.root}: give size_mb to create it")
            return volume
        size = validate_volume_size(size_mb)
        return await in_thread(lambda: self.create_sync(name, size))

    async def list(self) -> list[Volume]:
        return await in_thread(self.list_sync)

    async def delete(self, name: str) -> bool:
        name = validate_volume_name(name)
        return await in_thread(lambda: self.delete_sync(name))

    async def claim(self, attaches: tuple[VolumeAttach, ...]) -> VolumeClaims:
        return await in_thread(lambda: self.claim_sync(attaches), discard=VolumeClaims.close)

    async def hold_for_snapshot(self, snapshot_id: str, attaches: tuple[VolumeAttach, ...]) -> None:
        await in_thread(lambda: self.hold_for_snapshot_sync(snapshot_id, attaches))

    async def snapshot_volumes(self, snapshot_id: str) -> tuple[VolumeAttach, ...]:
        return await in_thread(lambda: self.snapshot_volumes_sync(snapshot_id))

    async def release_snapshot(self, snapshot_id: str) -> None:
        await in_thread(lambda: self.release_snapshot_sync(snapshot_id))

    # --- blocking work ---

    # --- paused sessions' claims ---

    def _claim_file(self, snapshot_id: str) -> Path:
        if not _SNAPSHOT_ID.fullmatch(snapshot_id):
            raise ValueError(f"not a snapshot id: {snapshot_id!r}")
        return self.root / "claims" / f"{snapshot_id}.json"

    def hold_for_snapshot_sync(self, snapshot_id: str, attaches: tuple[VolumeAttach, ...]) -> None:
        """Keep attaches (read-only) for the paused session snapshot_id. Its VM still holds
        their locks: no writer can come in between."""
        if any(not a.read_only for a in attaches):
            raise VolumeError("only read-only volumes are kept for a paused session")
        path = self._claim_file(snapshot_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        record: dict[str, object] = {"volumes": [[a.path, a.name, a.read_only] for a in attaches]}
        if self._sessions is not None:
            record["sessions"] = str(self._sessions)
        write_json_atomically(path, record)

    def snapshot_volumes_sync(self, snapshot_id: str) -> tuple[VolumeAttach, ...]:
        """What the paused session snapshot_id had attached (empty: none, or no claim)."""
        return self._read_hold(snapshot_id)[0]

    def _read_hold(self, snapshot_id: str) -> tuple[tuple[VolumeAttach, ...], Path | None]:
        """A hold's volumes and the directory of its snapshot's cache (None: not recorded)."""
        try:
            with open(self._claim_file(snapshot_id), "rb") as f:
                raw = f.read(_RECORD_MAX_BYTES + 1)
        except FileNotFoundError:
            return (), None
        try:
            data = json.loads(raw)
            entries = data["volumes"]
            attaches = tuple(VolumeAttach(str(p), str(n), bool(r)) for p, n, r in entries)
            sessions = data.get("sessions")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise VolumeError(f"unreadable volume claim of snapshot {snapshot_id}: {exc}") from exc
        if len(raw) > _RECORD_MAX_BYTES or any(not a.read_only for a in attaches):
            raise VolumeError(f"a volume claim of snapshot {snapshot_id} is not read-only")
        if sessions is not None and not (isinstance(sessions, str) and sessions.startswith("/")):
            raise VolumeError(f"a volume claim of snapshot {snapshot_id} names no directory")
        try:  # as volumes= checks them: they become kernel command line words at resume
            given = {a.path: VolumeMount(a.name, a.read_only) for a in attaches}
            if len(given) != len(attaches):
                raise InputValidationError("a mount path named twice")
            validate_volumes(given)
        except InputValidationError as exc:
            raise VolumeError(f"unreadable volume claim of snapshot {snapshot_id}: {exc}") from None
        return attaches, None if sessions is None else Path(sessions)

    def release_snapshot_sync(self, snapshot_id: str) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            self._claim_file(snapshot_id).unlink()

    def _held_by(self, name: str) -> str | None:
        """The id of a paused session that holds volume name, if any (stale claims go)."""
        directory = self.root / "claims"
        if not directory.is_dir():
            return None
        for path in sorted(directory.glob("*.json")):
            snapshot_id = path.name[: -len(".json")]
            if not _SNAPSHOT_ID.fullmatch(snapshot_id):
                continue
            try:
                attaches, sessions = self._read_hold(snapshot_id)
            except VolumeError:
                continue
            # The snapshot's own cache when the hold names it (another scheduler's may differ
            # from ours), else ours.
            if sessions is not None:
                exists = (sessions / snapshot_id).is_dir()
            else:
                exists = self._snapshot_exists is None or self._snapshot_exists(snapshot_id)
            if not exists:
                self.release_snapshot_sync(snapshot_id)
                continue
            if any(a.name == name for a in attaches):
                return snapshot_id
        return None

    def _image(self, name: str) -> Path:
        return self.root / f"{name}.img"

    def _record(self, name: str) -> Path:
        return self.root / f"{name}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def get_sync(self, name: str) -> Volume | None:
        """The record of name, or None (also for a record without its image)."""
        try:
            with open(self._record(name), "rb") as f:
                raw = f.read(_RECORD_MAX_BYTES + 1)
            if not self._image(name).exists():
                return None
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw)
            volume = Volume(str(data["name"]), int(data["size_mb"]), float(data["created_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise VolumeError(f"volume {name!r}: unreadable record ({exc})") from exc
        if volume.name != name or len(raw) > _RECORD_MAX_BYTES:
            raise VolumeError(f"volume {name!r}: its record names another volume")
        return volume

    def create_sync(self, name: str, size_mb: int) -> Volume:
        """The volume name, made empty at size_mb if there is none. An existing one of another
        size is an error (volumes do not grow or shrink)."""
        with self._locked():
            existing = self.get_sync(name)
            if existing is not None:
                if existing.size_mb != size_mb:
                    raise VolumeError(
                        f"volume {name!r} exists with size_mb={existing.size_mb}, not {size_mb}"
                    )
                return existing
            image = self._image(name)
            tmp = self.root / f".{name}.{os.getpid()}.tmp"
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    os.ftruncate(fd, size_mb << 20)  # sparse: no block written
                finally:
                    os.close(fd)
                os.replace(tmp, image)  # a leftover image of a crashed create is replaced
            except OSError as exc:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                raise VolumeError(f"cannot create volume {name!r} in {self.root}: {exc}") from exc
            volume = Volume(name, size_mb, time.time())
            write_json_atomically(
                self._record(name),
                {"name": name, "size_mb": size_mb, "created_at": volume.created_at},
            )
            return volume

    def list_sync(self) -> builtins.list[Volume]:
        if not self.root.is_dir():
            return []
        volumes = []
        # By name: sorting the file names would put "data.img" (data.img.json) before "data".
        for name in sorted(record.name[: -len(".json")] for record in self.root.glob("*.json")):
            with contextlib.suppress(VolumeError):
                volume = self.get_sync(name)
                if volume is not None:
                    volumes.append(volume)
        return volumes

    def delete_sync(self, name: str) -> bool:
        """Remove the volume and its content; False when there was none. VolumeInUseError while
        any VM has it attached."""
        with self._locked():
            try:
                fd = os.open(self._image(name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                with contextlib.suppress(FileNotFoundError):
                    self._record(name).unlink()
                return False
            try:
                holder = self._held_by(name)  # the more telling reason first, as in claims
                if holder is not None:
                    raise VolumeInUseError(_held_message(name, holder))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise VolumeInUseError(
                        f"volume {name!r} is attached to a running sandbox: close it first"
                    ) from None
                holder = self._held_by(name)
                if holder is not None:
                    raise VolumeInUseError(_held_message(name, holder))
                # The record first: a volume is listed only while both exist.
                with contextlib.suppress(FileNotFoundError):
                    self._record(name).unlink()
                self._image(name).unlink()
            finally:
                os.close(fd)
            return True

    def claim_sync(self, attaches: tuple[VolumeAttach, ...]) -> VolumeClaims:
        """Open and lock every volume of attaches (all or none): VolumeError for one that does
        not exist, VolumeInUseError for one another VM holds in a conflicting mode."""
        claims = VolumeClaims(attaches)
        try:
            for attach in attaches:
                claims.fds.append(self._claim_one(attach))
        except BaseException:
            claims.close()
            raise
        return claims

    def _claim_one(self, attach: VolumeAttach) -> int:
        name = attach.name
        volume = self.get_sync(name)
        if volume is None:
            raise VolumeError(
                f"no volume {name!r} in {self.root}: create it first "
                f"(scheduler.volume({name!r}, size_mb=...) or sbx volume create)"
            )
        flags = (os.O_RDONLY if attach.read_only else os.O_RDWR) | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self._image(name), flags)
        except OSError as exc:
            raise VolumeError(f"cannot open volume {name!r}: {exc}") from exc
        try:
            # A paused session's hold, before the lock (the more telling reason while its VM
            # is still being reaped) and after it: the hold is written while that VM still
            # holds its lock, so a writer that got the lock since sees it.
            for locked in (False, True):
                if not attach.read_only:
                    holder = self._held_by(name)
                    if holder is not None:
                        raise VolumeInUseError(_held_message(name, holder))
                if locked:
                    break
                if not _try_lock(fd, attach.read_only):
                    raise VolumeInUseError(_in_use_message(fd, attach))
            st = os.fstat(fd)
            if st.st_nlink == 0:  # deleted between the lookup and the lock
                raise VolumeError(f"volume {name!r} was deleted")
            if st.st_size != volume.size_mb << 20:
                raise VolumeError(
                    f"volume {name!r}: its image is {st.st_size} bytes, not {volume.size_mb} MB"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd


def _try_lock(fd: int, read_only: bool) -> bool:
    """flock without waiting for a holder: LOCK_EX for a writer, LOCK_SH for a reader. A reader
    tries a few times over 50 ms: the last reader of an image to leave holds it exclusively for
    a moment (_take_back), which must not refuse a reader that comes then; a writer's hold is
    still refused at once, in effect (it lasts for its VM's life)."""
    for attempt in range(_READER_TRIES):
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if not read_only or attempt == _READER_TRIES - 1:
                return False
            time.sleep(0.01)
    return False


def _take_back(fd: int, read_only: bool) -> None:
    """Make an image given to a QEMU user (VolumeClaims.give_to) ours again, 0600, once no VM
    has it: left to that user (shared by every QEMU; `nobody` on a host without `sbx setup`),
    its processes outside any jail could read or write it wherever volume_dir can be reached.
    A read-only image may still be read by other VMs' QEMUs: only the last one (the only
    holder, which can take the lock exclusively) takes it back. Best effort: the lock is
    released all the same; an image left given (a host killed meanwhile) is taken back by the
    next attach that ends."""
    if read_only:
        try:
            # Not atomic (the shared lock goes first): a reader claiming meanwhile retries.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # another VM still reads it: the last one takes it back
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o600)
        os.fchown(fd, os.geteuid(), os.getegid())


def _held_message(name: str, snapshot_id: str) -> str:
    return (
        f"volume {name!r} is held read-only by the paused session {snapshot_id} (its saved "
        f"memory has it mounted): delete that snapshot to write or delete the volume"
    )


def _in_use_message(fd: int, attach: VolumeAttach) -> str:
    """Why a lock was refused: a writer holds it, or (for a read-write attach) readers do."""
    if attach.read_only:
        return f"volume {attach.name!r} is attached read-write by another sandbox"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return f"volume {attach.name!r} is attached read-write by another sandbox"
    fcntl.flock(fd, fcntl.LOCK_UN)
    return (
        f"volume {attach.name!r} is attached read-only by another sandbox (read-write needs it "
        f"alone)"
    )
