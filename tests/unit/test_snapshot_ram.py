"""The sealed memfd copies of snapshot RAM files that clones map (snapshots.RamFiles)."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from exec_sandbox.snapshots import RamFiles, Snapshot

MB = 1024 * 1024


def _sparse_ram(path: Path) -> bytes:
    """An 8 MiB file with data at 0, 3 MiB and its last page; holes elsewhere."""
    with open(path, "wb") as f:
        f.truncate(8 * MB)
        for offset, fill in ((0, b"a"), (3 * MB, b"b"), (8 * MB - 4096, b"c")):
            f.seek(offset)
            f.write(fill * 4096)
    return path.read_bytes()


def test_copy_is_identical_sparse_and_sealed(tmp_path: Path) -> None:
    content = _sparse_ram(tmp_path / "ram")
    files = RamFiles()
    try:
        fd = files.fd_for(Snapshot("k", tmp_path / "ram", tmp_path / "state"))
        assert os.fstat(fd).st_size == 8 * MB
        assert os.pread(fd, 8 * MB, 0) == content
        assert os.fstat(fd).st_blocks * 512 < 1 * MB  # holes stayed holes
        # Nobody can change it: no write(2), no shared writable mapping, no resize...
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)
        # ... not even through a fresh read-write open of the magic link QEMU uses.
        reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            with pytest.raises(OSError) as exc:
                os.write(reopened, b"x")
            assert exc.value.errno == errno.EPERM
        finally:
            os.close(reopened)
        # A private mapping is writable (the clone's copy-on-write RAM) and leaves it alone.
        private = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        private[0:1] = b"z"
        private.close()
        assert os.pread(fd, 1, 0) == b"a"
        # One copy per file version.
        assert files.fd_for(Snapshot("k", tmp_path / "ram", tmp_path / "state")) == fd
    finally:
        files.close()
    with pytest.raises(OSError):
        os.fstat(fd)
