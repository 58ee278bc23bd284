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
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
from pathlib import Path

from .._threads import in_thread
from ..errors import VmPermanentError, VmTransientError

# The disk's kind: the guest agent finds it by the serial "sbx-disk-work" (guest/src/workspace.c).
WORK_DISK_KIND = "work"
# ioctl FICLONE (linux/fs.h: _IOW(0x94, 9, int)): the whole file, sharing its extents.
_FICLONE = 0x40049409
# copy_file_range's chunk: large enough that the call count does not matter, small enough that
# one call never holds the thread for long.
_COPY_CHUNK = 64 << 20


class WorkDisk:
    """One VM's work disk: an open, nameless file of size_mb MB. Owned by the VM it is given to
    (VmSpec.work): closed with it (GuestVm.close), or by whoever made it if the VM never started."""

    def __init__(self, fd: int, size_mb: int) -> None:
        self.fd = fd
        self.size_mb = size_mb
        self.claimed = False  # given to a VM (spec.with_work_disk): never to a second one
        # Fixed at creation: QEMU (and the C core) open it in this very process or its child.
        self.path = Path(f"/proc/{os.getpid()}/fd/{fd}")

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Idempotent. The file goes once QEMU's own fd is closed too."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def link(self, path: Path) -> None:
        """Give the file a name (a paused session's disk; blocking): see `link`."""
        if self.closed:
            raise VmTransientError("the VM's work disk was closed")
        link(self.fd, path)


def link(fd: int, path: Path) -> None:
    """Give the nameless file open at fd the name path, read-only for its owner, this process's
    user (a snapshot's disk; blocking). linkat through /proc follows the magic link to the file
    (an O_TMPFILE opened without O_EXCL may be linked); where that fails (another file system),
    a copy. The C core handed the file to QEMU's uid: it is taken back first (QEMU is gone or
    stopped when this runs, and a snapshot's files are the host's alone)."""
    if os.geteuid() == 0:
        os.fchown(fd, os.getuid(), os.getgid())
    os.fchmod(fd, 0o400)
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
        os.fchmod(out, 0o400)
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
