"""Work disks on the host (vm/workspace.py): nameless sparse files, copies and links. No VM."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from exec_sandbox.errors import VmTransientError
from exec_sandbox.vm import workspace
from exec_sandbox.vm.spec import with_work_disk


def test_a_new_disk_is_sparse_nameless_and_reachable_by_its_proc_path(tmp_path: Path) -> None:
    disk = workspace.create(tmp_path / "disks", 64)
    try:
        assert list((tmp_path / "disks").iterdir()) == []  # O_TMPFILE: no name to leave behind
        st = os.fstat(disk.fd)
        assert st.st_size == 64 << 20 and st.st_blocks == 0
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert str(disk.path) == f"/proc/{os.getpid()}/fd/{disk.fd}"
        with open(disk.path, "rb") as f:  # what the C core does for QEMU
            assert f.read(4096) == bytes(4096)
    finally:
        disk.close()
    assert disk.closed
    disk.close()  # idempotent


def test_a_copy_has_the_same_bytes_and_keeps_the_holes(tmp_path: Path) -> None:
    source = workspace.create(tmp_path, 64)
    os.pwrite(source.fd, b"head", 0)
    os.pwrite(source.fd, b"x" * 100_000, 20 << 20)
    os.pwrite(source.fd, b"tail", (64 << 20) - 4)
    copy = workspace.create(tmp_path, 64, source.fd)
    try:
        for offset, size in ((0, 4), (20 << 20, 100_000), ((64 << 20) - 4, 4), (10 << 20, 4096)):
            assert os.pread(copy.fd, size, offset) == os.pread(source.fd, size, offset)
        # Only the data ranges were copied: a few blocks, not 64 MiB.
        assert os.fstat(copy.fd).st_blocks * 512 < 4 << 20
        # The copy is its own file: writing it leaves the source alone.
        os.pwrite(copy.fd, b"HEAD", 0)
        assert os.pread(source.fd, 4, 0) == b"head"
    finally:
        source.close()
        copy.close()


def test_a_copy_of_another_size_is_refused(tmp_path: Path) -> None:
    source = workspace.create(tmp_path, 64)
    try:
        with pytest.raises(VmTransientError, match="cannot be copied"):
            workspace.create(tmp_path, 128, source.fd)
    finally:
        source.close()


def test_a_link_names_the_file_read_only(tmp_path: Path) -> None:
    disk = workspace.create(tmp_path, 64)
    os.pwrite(disk.fd, b"saved", 4096)
    disk.link(tmp_path / "snapshot-disk")
    disk.close()
    saved = tmp_path / "snapshot-disk"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o400 and saved.stat().st_size == 64 << 20
    with open(saved, "rb") as f:
        f.seek(4096)
        assert f.read(5) == b"saved"


def test_a_directory_that_cannot_hold_disks_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(VmTransientError, match=str(blocker)):
        workspace.create(blocker, 64)


def test_a_disk_goes_to_one_vm_only(tmp_path: Path) -> None:
    from dataclasses import replace

    from exec_sandbox.images.catalog import GuestImages
    from exec_sandbox.vm.spec import VmSpec

    images = GuestImages.__new__(GuestImages)
    spec = VmSpec(qemu_binary="q", images=images, accel="tcg", memory_mb=128, disk_mb=64)
    with pytest.raises(RuntimeError, match="disk_dir"):
        asyncio.run(with_work_disk(spec))
    spec = replace(spec, disk_dir=tmp_path)
    first = asyncio.run(with_work_disk(spec))  # no disk given: a new one, the VM's
    assert first.work is not None and first.work.claimed
    assert [d.kind for d in first.disks()] == ["work"] and first.disks()[0].writable
    with pytest.raises(RuntimeError, match="second VM"):
        asyncio.run(with_work_disk(first))
    first.work.close()
    none = replace(spec, disk_mb=0)
    assert asyncio.run(with_work_disk(none)).work is None  # a template builder: tmpfs
