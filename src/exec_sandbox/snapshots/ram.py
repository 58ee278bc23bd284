"""Sealed memfd copies of L1 snapshot RAM files, the only form clones map (`RamFiles`), and the
RAM digest they are checked against (`ram_digest`): see l1.py's docstring for why."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hashlib import _Hash


class SnapshotIntegrityError(Exception):
    """A snapshot's RAM is not what was saved: the sealed copy made for clones does not match
    the digest recorded at build time (the file was damaged or changed since)."""


def mark_used(directory: Path) -> None:
    """Mark a snapshot directory as used now (its mtime orders l1's prune()); best effort."""
    try:
        os.utime(directory)
    except OSError:
        pass


class RamFiles:
    """Sealed memfd copies of snapshot RAM files, one per published file, for clones.

    A clone's QEMU (share=off) opens its RAM read-write (QEMU 7.2 has no read-only backing file
    with a writable private mapping). Given the cache file, a compromised clone could write to
    the template every later clone maps. A memfd sealed against writes, growth and shrinking
    can still be mapped privately and copy-on-write, but write(2) and shared writable mappings of
    it fail for everybody. Holes in the RAM file stay holes: only data ranges are copied.

    Each copy is checked against the snapshot's RAM digest once, right after it is sealed: the
    bytes verified are the bytes every clone of this object maps, and they cannot change. The
    copy a build makes to compute that digest (seal()) is kept, so the first clone of a snapshot
    built by this process neither copies nor hashes the file again."""

    def __init__(self) -> None:
        # (key, st_dev, st_ino, st_mtime_ns) of the RAM file -> its sealed copy. Renaming a
        # build directory into place changes none of these, so a copy made by seal() serves the
        # published file.
        self._fds: dict[tuple[str, int, int, int], int] = {}
        self._lock = threading.Lock()  # called from executor threads

    def seal(self, key: str, path: Path) -> str:
        """Make and keep the sealed copy of the RAM file a build of key has just saved (blocking:
        call it from an executor) and return its digest, which the build records."""
        with open(path, "rb", buffering=0) as f:
            fd, digest, ident = _seal(key, f.fileno())
        with self._lock:  # not held while copying: a foreground fd_for need not wait for that
            self._keep(ident, fd)
        return digest

    def fd_for(self, key: str, ram: Path, expected_digest: str) -> int:
        """The sealed, verified memfd for snapshot key's RAM file ram (made on first use;
        blocking: call it from an executor). Valid until close(). SnapshotIntegrityError if the
        RAM does not match expected_digest (nothing is kept then)."""
        with self._lock:
            with open(ram, "rb", buffering=0) as f:
                fd = self._fds.get(_ident(key, os.fstat(f.fileno())))
                if fd is not None:
                    return fd
                fd, digest, ident = _seal(key, f.fileno())
            if digest != expected_digest:
                os.close(fd)
                raise SnapshotIntegrityError(
                    f"RAM of memory snapshot {key} does not match its digest"
                )
            self._keep(ident, fd)
            mark_used(ram.parent)  # used: once per scheduler and file
            return fd

    def _keep(self, ident: tuple[str, int, int, int], fd: int) -> None:
        for old in [k for k in self._fds if k[0] == ident[0]]:
            os.close(self._fds.pop(old))  # a rebuilt file: its old copy is unused now
        self._fds[ident] = fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _ident(key: str, st: os.stat_result) -> tuple[str, int, int, int]:
    return (key, st.st_dev, st.st_ino, st.st_mtime_ns)


def _seal(key: str, src: int) -> tuple[int, str, tuple[str, int, int, int]]:
    """A sealed copy of the RAM file open as src, its digest and its RamFiles identity."""
    st = os.fstat(src)
    fd = _sealed_copy(src, st.st_size)
    try:
        return fd, _memfd_digest(fd, st.st_size), _ident(key, st)
    except BaseException:
        os.close(fd)
        raise


def ram_digest(path: Path) -> str:
    """The digest RamFiles.fd_for checks, of a RAM file as it is now (what RamFiles.seal
    returns, without keeping the copy)."""
    with open(path, "rb", buffering=0) as f:
        fd, digest, _ident = _seal("", f.fileno())
    os.close(fd)
    return digest


def fd_digest(fd: int) -> str:
    """The same digest of any file (a paused session's work disk): of its bytes, data ranges
    only read. Read with pread, never mapped: a pause hashes the disk while its QEMU, stopped
    but not yet killed, still holds it open read-write, and a file truncated under a mapping
    kills the reader with SIGBUS (the whole host process). A file that shrinks while hashed
    is an OSError. Blocking."""
    size = os.fstat(fd).st_size
    h = _digest_start(size)
    block = -1
    for start, end in _iter_data_ranges(fd, size):
        for offset in range(
            max(start // _DIGEST_BLOCK, block + 1) * _DIGEST_BLOCK, end, _DIGEST_BLOCK
        ):
            block = offset // _DIGEST_BLOCK
            want = min(_DIGEST_BLOCK, size - offset)
            chunk = os.pread(fd, want, offset)
            if len(chunk) != want:
                raise OSError(errno.EIO, "the file shrank while it was hashed")
            if chunk != _ZERO_BLOCK[:want]:
                h.update(struct.pack("<Q", offset))
                h.update(chunk)
    if os.fstat(fd).st_size != size:  # shrank past the ranges still to come
        raise OSError(errno.EIO, "the file changed size while it was hashed")
    return h.hexdigest()


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of each data range of fd below size, in order (SEEK_DATA / SEEK_HOLE).
    A list: for RAM files only, whose size (memory_mb) bounds how many there are."""
    return list(_iter_data_ranges(fd, size))


def _iter_data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """_data_ranges one by one: a work disk's count is its guest's choice (one per other
    block of a disk of up to 1 TiB), so nothing keeps them all."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        offset = end


# F_SEAL_WRITE waits a moment for page references it cannot tell from a pin, then fails with
# EBUSY: pages just written can still sit in another CPU's LRU batch, which holds a reference
# until that CPU drains it (a thread that moved between CPUs under load meets it). Tries and the
# pause between them: enough for any CPU's batch to drain, short beside a snapshot build.
_SEAL_TRIES = 20
_SEAL_RETRY_S = 0.05


def seal_against_changes(memfd: int) -> None:
    """Seal memfd against writes, growth, shrinking and further seals; retried while the kernel
    says EBUSY (see _SEAL_TRIES). Blocking (it may sleep up to a second)."""
    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    for attempt in range(_SEAL_TRIES):
        try:
            fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == _SEAL_TRIES - 1:
                raise
        time.sleep(_SEAL_RETRY_S)


def _sealed_copy(src: int, size: int) -> int:
    """A memfd with src's first size bytes, sealed against any change. Its holes are allocated
    (fallocate: zero pages the file still reports as holes, so the digest does not change)
    before it is sealed: a clone maps it privately, and a fault of a clone on a hole of a shmem
    file allocates a page in that file (on a read as well as before copying it on a write).
    Left sparse, every page a clone touched grew this copy for the scheduler's lifetime and was
    charged twice to the clone's cgroup (file page + its private copy): a guest using its RAM
    got QEMU OOM-killed by the host. Allocated up front, a clone's own memory is its private
    copies only, and this copy holds the guest's RAM size, once per snapshot file."""
    memfd = os.memfd_create("sbx-snapshot-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, size)
        for start, end in _data_ranges(src, size):
            os.lseek(memfd, start, os.SEEK_SET)  # sendfile writes at memfd's position
            while start < end:
                n = os.sendfile(memfd, src, start, min(end - start, 1 << 24))
                if n <= 0:
                    raise OSError(f"short copy of snapshot RAM at {start}")
                start += n
        os.posix_fallocate(memfd, 0, size)
        seal_against_changes(memfd)
    except BaseException:
        os.close(memfd)
        raise
    return memfd


# The digest's unit: a block of the RAM file that is all zeros, a hole or data, is left out.
_DIGEST_BLOCK = 64 * 1024
_ZERO_BLOCK = bytes(_DIGEST_BLOCK)


def _memfd_digest(fd: int, size: int) -> str:
    """SHA-256 over the size, then the offset and bytes of each _DIGEST_BLOCK-aligned block that
    is not all zeros. Of the bytes only, not of where the file keeps them: a hole and a block of
    zeros stored as data are the same memory to a clone, and copies of a file make one of the
    other (`cp -a` turns zero blocks into holes; other tools fill holes), so a byte-identical
    copy has the same digest; any byte that changed, in data or in a hole, changes it."""
    h = _digest_start(size)
    ranges = _data_ranges(fd, size)
    if not ranges:
        return h.hexdigest()
    # Only blocks that hold data can hold anything but zeros: holes are neither read nor hashed.
    # Hashed straight from a read-only mapping (hashlib releases the GIL for large inputs).
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mem:
        with memoryview(mem) as view:
            block = -1
            for start, end in ranges:
                for offset in range(
                    max(start // _DIGEST_BLOCK, block + 1) * _DIGEST_BLOCK, end, _DIGEST_BLOCK
                ):
                    block = offset // _DIGEST_BLOCK
                    with view[offset : min(offset + _DIGEST_BLOCK, size)] as chunk:
                        if chunk != _ZERO_BLOCK[: len(chunk)]:
                            h.update(struct.pack("<Q", offset))
                            h.update(chunk)
    return h.hexdigest()


def _digest_start(size: int) -> _Hash:
    """The digest's state before any block: its version, the size and the block size."""
    h = hashlib.sha256(b"sbx-ram-digest-2")
    h.update(struct.pack("<QQ", size, _DIGEST_BLOCK))
    return h
