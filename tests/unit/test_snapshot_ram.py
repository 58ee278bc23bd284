"""The sealed memfd copies of snapshot RAM files that clones map (ram.RamFiles), and the
RAM digest they are checked against once each."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import pytest

from exec_sandbox.snapshots.l1 import Snapshot
from exec_sandbox.snapshots.ram import RamFiles, SnapshotIntegrityError, ram_digest

MB = 1024 * 1024


def _sparse_ram(path: Path) -> bytes:
    """An 8 MiB file with data at 0, 3 MiB and its last page; holes elsewhere."""
    with open(path, "wb") as f:
        f.truncate(8 * MB)
        for offset, fill in ((0, b"a"), (3 * MB, b"b"), (8 * MB - 4096, b"c")):
            f.seek(offset)
            f.write(fill * 4096)
    return path.read_bytes()


def _snapshot(directory: Path) -> Snapshot:
    """A Snapshot of directory/ram with the digest of the file as it is now."""
    return Snapshot("k", directory / "ram", directory / "state", ram_digest(directory / "ram"))


def _fd_for(files: RamFiles, snapshot: Snapshot) -> int:
    return files.fd_for(snapshot.key, snapshot.ram, snapshot.ram_digest)


def test_copy_is_identical_sealed_and_never_grows(tmp_path: Path) -> None:
    content = _sparse_ram(tmp_path / "ram")
    files = RamFiles()
    try:
        fd = _fd_for(files, _snapshot(tmp_path))
        assert os.fstat(fd).st_size == 8 * MB
        assert os.pread(fd, 8 * MB, 0) == content
        # Allocated up front (zeros either way: the digest is the same): a clone's
        # private mapping that touches a hole, reading or writing, allocates nothing in it.
        held = os.fstat(fd).st_blocks
        assert held * 512 == 8 * MB
        with mmap.mmap(
            fd, 8 * MB, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        ) as clone:
            assert clone[5 * MB] == 0
            clone[6 * MB] = 1
        assert os.fstat(fd).st_blocks == held
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
        assert _fd_for(files, _snapshot(tmp_path)) == fd
    finally:
        files.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: _flip_byte(p, 3 * MB + 100), id="flipped-bit-in-data"),
        pytest.param(lambda p: _flip_byte(p, 5 * MB), id="hole-became-data"),
    ],
)
def test_damaged_ram_is_refused_and_nothing_kept(tmp_path: Path, damage: object) -> None:
    _sparse_ram(tmp_path / "ram")
    snapshot = _snapshot(tmp_path)  # the digest of the file as built
    assert callable(damage)
    damage(tmp_path / "ram")
    assert (tmp_path / "ram").stat().st_size == 8 * MB  # same size: the size check passes
    fds_before = set(os.listdir("/proc/self/fd"))
    files = RamFiles()
    try:
        with pytest.raises(SnapshotIntegrityError, match="does not match its digest"):
            _fd_for(files, snapshot)
        assert set(os.listdir("/proc/self/fd")) == fds_before  # the bad copy was closed
        # Checked again on the next attempt (a refused copy is not cached) ...
        with pytest.raises(SnapshotIntegrityError):
            _fd_for(files, snapshot)
        # ... and the same file passes against its current digest.
        assert os.fstat(_fd_for(files, _snapshot(tmp_path))).st_size == 8 * MB
    finally:
        files.close()


def _data_ranges(path: Path) -> list[tuple[int, int]]:
    from exec_sandbox.snapshots.ram import _data_ranges

    with open(path, "rb", buffering=0) as f:
        return _data_ranges(f.fileno(), os.fstat(f.fileno()).st_size)


def test_digest_is_of_the_bytes_not_of_where_the_file_keeps_them(tmp_path: Path) -> None:
    # Same bytes as read(2) sees them, different layout: explicit zero pages where the other
    # file has a hole (a guest's zeroed pages; a copy turns them into holes, or the reverse).
    # Clones of either map the same memory: one digest.
    _sparse_ram(tmp_path / "ram")
    with open(tmp_path / "ram", "r+b") as f:
        f.seek(5 * MB)
        f.write(bytes(MB + 4096))
        f.seek(3 * MB + 4096)
        f.write(bytes(4096))  # zeros right after data, inside one digest block
    (tmp_path / "other").mkdir()
    _sparse_ram(tmp_path / "other" / "ram")
    assert (tmp_path / "ram").read_bytes() == (tmp_path / "other" / "ram").read_bytes()
    assert _data_ranges(tmp_path / "ram") != _data_ranges(tmp_path / "other" / "ram")
    assert ram_digest(tmp_path / "ram") == ram_digest(tmp_path / "other" / "ram")


def _published(root: Path, key: str) -> Path:
    """A published snapshot directory as SnapshotCache.build leaves it, its RAM with zero pages
    stored as data (what a guest's zeroed memory is in the file QEMU wrote)."""
    import json

    from exec_sandbox.digest import file_sha256
    from exec_sandbox.snapshots.l1 import SNAPSHOT_FORMAT

    directory = root / key
    directory.mkdir(parents=True)
    _sparse_ram(directory / "ram")
    with open(directory / "ram", "r+b") as f:
        f.seek(5 * MB)
        f.write(bytes(MB))
    (directory / "state").write_bytes(b"device state")
    meta = {
        "format": SNAPSHOT_FORMAT,
        "key": key,
        "state_sha256": file_sha256(directory / "state"),
        "ram_bytes": 8 * MB,
        "ram_digest": ram_digest(directory / "ram"),
    }
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


def test_a_byte_identical_copy_of_a_snapshot_is_used(tmp_path: Path) -> None:
    """`cp -a` of a snapshot directory (a backup put back, a cache moved to another disk) keeps
    every byte but not the inode, nor where the RAM file keeps its zero pages (cp makes holes of
    them): it is found and cloned from, not refused as damaged and rebuilt. A copy whose RAM
    changed still is refused."""
    import shutil
    import subprocess

    from exec_sandbox.snapshots.l1 import SnapshotCache

    key = "python-8m-" + "0" * 24
    original = _published(tmp_path / "cache", key)
    content = (original / "ram").read_bytes()
    for name, damaged in (("copy", False), ("damaged", True)):
        root = tmp_path / name
        root.mkdir()
        subprocess.run(["cp", "-a", str(original), str(root / key)], check=True)
        if damaged:
            _flip_byte(root / key / "ram", 5 * MB + 7)
        cache = SnapshotCache(root)
        try:
            snapshot = cache.lookup(key, 8)
            assert snapshot is not None
            if damaged:
                with pytest.raises(SnapshotIntegrityError):
                    cache.ram_fd(snapshot)
            else:
                assert os.pread(cache.ram_fd(snapshot), 8 * MB, 0) == content
        finally:
            cache.close()
        shutil.rmtree(root)


def test_first_copy_marks_the_snapshot_used(tmp_path: Path) -> None:
    _sparse_ram(tmp_path / "ram")
    snapshot = _snapshot(tmp_path)
    os.utime(tmp_path, (1_000_000, 1_000_000))
    files = RamFiles()
    try:
        _fd_for(files, snapshot)
        assert tmp_path.stat().st_mtime > 1_000_000  # what prune() orders by
        os.utime(tmp_path, (1_000_000, 1_000_000))
        _fd_for(files, snapshot)
        assert tmp_path.stat().st_mtime == 1_000_000  # once per copy, not per clone
    finally:
        files.close()


def test_the_copy_a_build_seals_serves_the_published_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build's digest comes from a sealed copy that RamFiles keeps: once the build directory
    is renamed into place, the first clone maps that copy instead of copying and hashing again."""
    from exec_sandbox.snapshots import ram

    build = tmp_path / ".build-k"
    build.mkdir()
    content = _sparse_ram(build / "ram")
    files = RamFiles()
    try:
        digest = files.seal("k", build / "ram")
        assert digest == ram_digest(build / "ram")
        os.rename(build, tmp_path / "k")

        def no_second_copy(src: int, size: int) -> int:
            raise AssertionError("the published RAM was copied again")

        monkeypatch.setattr(ram, "_sealed_copy", no_second_copy)
        fd = _fd_for(files, Snapshot("k", tmp_path / "k" / "ram", tmp_path / "k" / "state", digest))
        assert os.pread(fd, 8 * MB, 0) == content
    finally:
        files.close()


def test_a_work_disk_that_shrinks_while_hashed_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """A pause hashes the VM's work disk while that VM's QEMU still runs (stopped, not yet
    killed) and holds the file open read-write: a QEMU its guest took over can truncate it
    in the middle. Hashed through a mapping, the host process died of SIGBUS there, and every
    sandbox of its scheduler with it; the disk's digest reads the file instead, and a file
    that shrank is an OSError (the pause fails, the host goes on)."""
    import subprocess
    import sys

    disk = tmp_path / "disk"
    _sparse_ram(disk)
    script = f"""
import hashlib, os
from exec_sandbox.snapshots import ram

fd = os.open({str(disk)!r}, os.O_RDWR)

class Shrinking:  # the file is truncated once the first block is hashed, as a QEMU could
    def __init__(self, data):
        self.h, self.calls = hashlib.sha256(data), 0
    def update(self, data):
        self.h.update(data)
        self.calls += 1
        if self.calls == 3:
            os.ftruncate(fd, 0)
    def hexdigest(self):
        return self.h.hexdigest()

ram.hashlib = type("hashlib", (), {{"sha256": Shrinking}})
try:
    ram.fd_digest(fd)
    print("digest")
except OSError:
    print("error")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "error\n"), done.stderr


def test_the_disk_digest_is_the_ram_digest(tmp_path: Path) -> None:
    """fd_digest (work disks) and the RAM files' digest are one function of the bytes: a
    snapshot paused before the disk's digest read the file still resumes."""
    from exec_sandbox.snapshots.ram import fd_digest

    path = tmp_path / "disk"
    _sparse_ram(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fd_digest(fd) == ram_digest(path)
    finally:
        os.close(fd)


def test_the_disk_digest_holds_no_list_of_a_fragmented_disks_ranges(tmp_path: Path) -> None:
    """How many data ranges a work disk has is the guest's choice (a byte written every other
    block of a disk of up to 1 TiB): the digest walks them one by one. A list of them, as
    the RAM files' copy keeps (bounded by memory_mb), cost the host ~100 bytes per range:
    gigabytes of memory for a guest's pause or resume."""
    import tracemalloc

    from exec_sandbox.snapshots.ram import fd_digest

    path = tmp_path / "disk"
    ranges = 20_000
    with open(path, "wb") as f:
        f.truncate(ranges * 2 * 64 * 1024)
        for i in range(ranges):
            f.seek(i * 2 * 64 * 1024)
            f.write(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        if os.lseek(fd, 0, os.SEEK_HOLE) >= 2 * 64 * 1024:
            pytest.skip("this file system reports no holes at 64 KiB")
        tracemalloc.start()
        try:
            fd_digest(fd)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        os.close(fd)
    assert peak < 1 << 20, f"{peak} bytes for {ranges} data ranges"


def test_a_seal_the_kernel_refuses_for_a_moment_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """F_SEAL_WRITE fails with EBUSY while a page of the memfd still has a transient reference
    (another CPU's LRU batch): the seal is tried again instead of failing the snapshot build."""
    from exec_sandbox.snapshots import ram as ram_module

    real = ram_module.fcntl.fcntl
    refusals = []

    def flaky(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_ADD_SEALS and len(refusals) < 2:
            refusals.append(cmd)
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(fd, cmd, arg)

    monkeypatch.setattr(ram_module.fcntl, "fcntl", flaky)
    monkeypatch.setattr(ram_module, "_SEAL_RETRY_S", 0.0)
    memfd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        ram_module.seal_against_changes(memfd)
        assert len(refusals) == 2
        assert real(memfd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
        with pytest.raises(PermissionError):
            os.write(memfd, b"x")
    finally:
        os.close(memfd)


def test_a_seal_refused_for_good_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from exec_sandbox.snapshots import ram as ram_module

    def busy(fd: int, cmd: int, arg: int = 0) -> int:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(ram_module.fcntl, "fcntl", busy)
    monkeypatch.setattr(ram_module, "_SEAL_RETRY_S", 0.0)
    with pytest.raises(OSError) as raised:
        ram_module.seal_against_changes(-1)
    assert raised.value.errno == errno.EBUSY
