"""Each VM's work disk (docs/design.md, "Workspace"): the raw file the guest formats and puts
/home/user and /tmp on. The host only creates it, empty, and copies it whole; it never reads
what the guest wrote (docs/security.md).

A disk is an O_TMPFILE: a file without a name, in a directory on the cache's file system (so
that a pause can link it into a snapshot directory, and copies can share extents with it).
Nothing of it outlives the last fd: the host's (`WorkDisk.fd`, closed with the VM) and QEMU's
own. A host killed by SIGKILL leaves no disk behind.

QEMU gets it by the path /proc/<pid>/fd/<fd> of this process: the C core opens that for the
jailed QEMU (which then gets its own fd, owned by the jail's uid, RLIMIT_FSIZE the disk's
size), and an unjailed QEMU, a child of this process, may open it itself.

Copies (`clone`): FICLONE where the file system shares extents (btrfs, XFS: O(1), copy on
write), else only the data ranges (SEEK_DATA/SEEK_HOLE) with copy_file_range, so a sparse
disk stays sparse. Always blocking: callers run them in a thread.

Forks (`freeze`, `derive`): a fork freezes the parent's disk (nothing writes it again, the
parent's QEMU switches to an overlay over QMP: snapshots/forks.py), and every VM that goes on
from it, the parent too, writes an empty qcow2 overlay of its own on the frozen file, made by
`qemu-img create`: a fork costs the same however much the disk holds, on any file system. Only
QEMU reads an overlay; to the host it is bytes it copies (the overlay of a VM forked again, a
paused one's on resume), never parses. Without qemu-img, forks copy the disk.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import shutil
import subprocess
from pathlib import Path

from .._threads import in_thread
from ..errors import VmPermanentError, VmTransientError

# The disk's kind: the guest agent finds it by the serial "sbx-disk-work" (guest/src/workspace.c).
WORK_DISK_KIND = "work"
# A forked work disk's frozen file, beneath the VM's overlay: a block node QEMU reads, no device.
WORK_BASE_KIND = "workbase"
# ioctl FICLONE (linux/fs.h: _IOW(0x94, 9, int)): the whole file, sharing its extents.
_FICLONE = 0x40049409
# copy_file_range's chunk: large enough that the call count does not matter, small enough that
# one call never holds the thread for long.
_COPY_CHUNK = 64 << 20
# What QEMU may add to an overlay beyond the data (qcow2 with 64 KiB clusters: an 8-byte L2 entry
# and a 2-byte refcount per cluster, tables and header): the bound of the file's growth that the
# jail's RLIMIT_FSIZE enforces, with room to spare.
_OVERLAY_SLACK_DIVISOR = 4096
_OVERLAY_SLACK_BYTES = 8 << 20
_QEMU_IMG_TIMEOUT_SECONDS = 30


class WorkDisk:
    """One VM's work disk: an open, nameless file of size_mb MB, raw; or a qcow2 overlay on a
    frozen disk (`base`) that other VMs may share. Owned by the VM it is given to (VmSpec.work):
    closed with it (GuestVm.close), or by whoever made it if the VM never started."""

    def __init__(self, fd: int, size_mb: int, *, base: WorkDisk | None = None) -> None:
        self.fd = fd
        self.size_mb = size_mb
        self.base = base  # an overlay's disk beneath: this holder's own fd of it
        self.frozen = False  # nothing writes it again: a VM may get an overlay on it (derive)
        self.claimed = False  # given to a VM (spec.with_work_disk): never to a second one
        # Fixed at creation: QEMU (and the C core) open it in this very process or its child.
        self.path = Path(f"/proc/{os.getpid()}/fd/{fd}")

    @property
    def overlay(self) -> bool:
        return self.base is not None

    @property
    def max_bytes(self) -> int:
        """How large QEMU may make the file: see max_file_bytes."""
        return max_file_bytes(self.size_mb)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Idempotent. The file goes once QEMU's own fd is closed too (and every other
        holder's, for a frozen disk)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        if self.base is not None:
            self.base.close()

    def share(self) -> WorkDisk:
        """Another holder of this frozen disk: its own fd, closed on its own."""
        if self.closed or not self.frozen:
            raise VmTransientError("only a frozen work disk is shared")
        disk = WorkDisk(os.dup(self.fd), self.size_mb)
        disk.frozen = True
        return disk

    def link(self, path: Path) -> None:
        """Give the file a name (a paused session's disk; blocking): see `link`."""
        if self.closed:
            raise VmTransientError("the VM's work disk was closed")
        link(self.fd, path, mode=0o444 if self.frozen else 0o400)


def max_file_bytes(size_mb: int) -> int:
    """How large QEMU may make a work disk's file (the jail's RLIMIT_FSIZE): the disk's size, and
    an overlay's metadata. The same bound for a raw disk, which QEMU never writes past its end,
    keeps the limit right for a parent that a fork moves onto an overlay."""
    size = size_mb << 20
    return size + size // _OVERLAY_SLACK_DIVISOR + _OVERLAY_SLACK_BYTES


def link(fd: int, path: Path, *, mode: int = 0o400) -> None:
    """Give the nameless file open at fd the name path, read-only for its owner, this process's
    user (a snapshot's disk; blocking). linkat through /proc follows the magic link to the file
    (an O_TMPFILE opened without O_EXCL may be linked); where that fails (another file system),
    a copy. The C core handed the file to QEMU's uid: it is taken back first (QEMU is gone or
    stopped when this runs, and a snapshot's files are the host's alone). A frozen disk stays
    readable by all (mode 0o444): jailed QEMUs of other VMs reopen it by /proc/self/fd, under
    their own uid; no path leads to it but the snapshot's, in a 0700 directory."""
    if os.geteuid() == 0:
        os.fchown(fd, os.getuid(), os.getgid())
    os.fchmod(fd, mode)
    try:
        os.link(f"/proc/self/fd/{fd}", path, follow_symlinks=True)
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.ENOENT, errno.EOPNOTSUPP):
            raise
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(out, os.fstat(fd).st_size)
        clone(fd, out)
        os.fchmod(out, mode)
    finally:
        os.close(out)


def _tmpfile(directory: Path) -> int:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise VmPermanentError(
                f"cannot create a VM's work disk in {directory}: its file system has no "
                f"O_TMPFILE support ({exc.strerror}); put memory_snapshot_cache_dir on one "
                f"that has (ext4, XFS, btrfs, tmpfs)"
            ) from None
        raise VmTransientError(
            f"cannot create a VM's work disk in {directory}: {exc.strerror}"
        ) from None


def create(directory: Path, size_mb: int, source: int | None = None) -> WorkDisk:
    """A new disk of size_mb MB in directory: empty (sparse: all zeros, no block used), or a
    copy of the file open at `source` (same size). Blocking. VmTransientError (no space, ...) or
    VmPermanentError (no O_TMPFILE) naming the directory."""
    fd = _tmpfile(directory)
    disk = WorkDisk(fd, size_mb)
    try:
        os.ftruncate(fd, size_mb << 20)
        if source is not None:
            size = os.fstat(source).st_size
            if size != size_mb << 20:
                raise VmTransientError(
                    f"a work disk of {size} bytes cannot be copied into one of {size_mb} MB"
                )
            clone(source, fd)
    except OSError as exc:
        disk.close()
        raise VmTransientError(
            f"cannot create a VM's work disk in {directory}: {exc.strerror}"
        ) from None
    except BaseException:
        disk.close()
        raise
    return disk


def overlays_available() -> bool:
    """Whether forks get overlays (qemu-img on PATH) rather than copies."""
    return shutil.which("qemu-img") is not None


def freeze(disk: WorkDisk) -> None:
    """Mark a raw disk that nothing writes again (its VM's QEMU has just moved onto an overlay
    on it, or the VM is gone): later VMs get overlays on it. Readable by all: see `link`."""
    if disk.overlay:
        raise VmTransientError("only a raw work disk is frozen")
    os.fchmod(disk.fd, 0o444)
    disk.frozen = True


def thaw(disk: WorkDisk) -> None:
    """Undo freeze() (a fork failed before the parent moved onto its overlay)."""
    if disk.frozen and not disk.closed:
        os.fchmod(disk.fd, 0o600)
    disk.frozen = False


def copy_into(src: WorkDisk, dst: WorkDisk) -> None:
    """Make dst hold src's bytes (src's VM stopped): dst is a new disk of the same shape, an
    empty raw one of src's size, or an empty overlay on src's frozen disk. Blocking."""
    if src.overlay != dst.overlay or src.size_mb != dst.size_mb:
        raise VmTransientError("a work disk cannot be copied into one of another shape")
    if dst.overlay:  # its fresh header goes: the copy is src's file, byte for byte
        os.ftruncate(dst.fd, 0)
        os.ftruncate(dst.fd, os.fstat(src.fd).st_size)
    clone(src.fd, dst.fd)


def create_overlay(directory: Path, base: WorkDisk) -> WorkDisk:
    """An empty qcow2 overlay on the frozen disk base (which the result holds a share of), made
    by qemu-img in directory. Blocking. VmTransientError if qemu-img fails."""
    fd = _tmpfile(directory)
    disk = WorkDisk(fd, base.size_mb, base=base.share())
    try:
        done = subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-o",
                "cluster_size=65536",
                f"/proc/self/fd/{fd}",
                str(base.size_mb << 20),
            ],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_QEMU_IMG_TIMEOUT_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            raise VmTransientError(
                f"qemu-img could not make a work disk overlay: {done.stderr.strip()[:300]}"
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        disk.close()
        raise VmTransientError(f"qemu-img could not make a work disk overlay: {exc}") from None
    except BaseException:
        disk.close()
        raise
    return disk


def derive(directory: Path, disk: WorkDisk) -> WorkDisk:
    """A disk for another VM holding what disk holds now (its VM is stopped or gone): an empty
    overlay on it if it is frozen, else a copy of its file (an overlay's: the copy is an overlay
    on the same frozen disk). Blocking."""
    if disk.frozen:
        return create_overlay(directory, disk)
    fd = _tmpfile(directory)
    copy = WorkDisk(fd, disk.size_mb, base=None if disk.base is None else disk.base.share())
    try:
        os.ftruncate(fd, os.fstat(disk.fd).st_size)
        clone(disk.fd, fd)
    except OSError as exc:
        copy.close()
        raise VmTransientError(
            f"cannot copy a VM's work disk in {directory}: {exc.strerror}"
        ) from None
    except BaseException:
        copy.close()
        raise
    return copy


async def derived(directory: Path, disk: WorkDisk) -> WorkDisk:
    """derive() in a thread."""
    return await in_thread(functools.partial(derive, directory, disk), discard=WorkDisk.close)


def open_file(path: Path) -> int:
    """A saved disk (a snapshot's), read-only, for `create(source=...)`. Blocking."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


async def new(directory: Path, size_mb: int, source: int | None = None) -> WorkDisk:
    """create() in a thread (a copy of a written disk takes a while without FICLONE)."""
    return await in_thread(
        functools.partial(create, directory, size_mb, source), discard=WorkDisk.close
    )


def clone(src: int, dst: int) -> None:
    """Make dst (an empty file of src's size) hold src's bytes: FICLONE where the file system
    shares extents, else src's data ranges copied with copy_file_range (its holes stay holes in
    dst). Blocking."""
    try:
        fcntl.ioctl(dst, _FICLONE, src)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
            raise
    size = os.fstat(src).st_size
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after offset: the rest is a hole
                return
            raise
        end = os.lseek(src, start, os.SEEK_HOLE)
        at = start
        while at < end:
            done = os.copy_file_range(src, dst, min(end - at, _COPY_CHUNK), at, at)
            if done == 0:  # src shrank under us: it is ours alone, so it cannot
                raise OSError(errno.EIO, "short copy of a work disk")
            at += done
        offset = end
