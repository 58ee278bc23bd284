"""The volume store and the checks of `volumes=`, without VMs: names, sizes, mount paths, the
locks that make a volume read-write in one VM or read-only in many, and deletion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exec_sandbox import InputValidationError, Volume, VolumeError, VolumeInUseError, VolumeMount
from exec_sandbox.cli.arguments import EXIT_USAGE, run_command
from exec_sandbox.volumes import (
    VolumeAttach,
    VolumeStore,
    kernel_cmdline,
    parse_volume_option,
    validate_volumes,
)


def rw(name: str, path: str = "/mnt/data") -> tuple[VolumeAttach, ...]:
    return (VolumeAttach(path, name, False),)


def ro(name: str, path: str = "/mnt/data") -> tuple[VolumeAttach, ...]:
    return (VolumeAttach(path, name, True),)


def test_a_volume_is_a_sparse_empty_file_and_a_record(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    volume = store.create_sync("data", 64)
    assert (volume.name, volume.size_mb) == ("data", 64)
    image = tmp_path / "data.img"
    assert image.stat().st_size == 64 << 20
    assert image.stat().st_blocks == 0  # nothing written: sparse
    assert image.stat().st_mode & 0o777 == 0o600
    assert store.list_sync() == [volume]
    assert store.create_sync("data", 64) == volume  # the existing one
    with pytest.raises(VolumeError, match="size_mb=64"):
        store.create_sync("data", 128)


def test_volumes_are_listed_by_name(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    for name in ("data.img", "data", "data-2"):
        store.create_sync(name, 16)
    assert [v.name for v in store.list_sync()] == ["data", "data-2", "data.img"]


def test_sbx_calls_an_unknown_volume_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def command() -> int:
        await VolumeStore(tmp_path).claim(rw("nope"))
        return 0

    assert run_command(command) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no volume 'nope'" in err and "sandbox failure" not in err


@pytest.mark.parametrize("name", ["", "Data", "-x", ".x", "a/b", "a" * 64, "é"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputValidationError):
        validate_volumes({"/mnt/data": name})


@pytest.mark.parametrize(
    "path",
    [
        "mnt/data",
        "/data",
        "/",
        "/mnt/../etc",
        "/mnt/./x",
        "/mnt//x",
        "/mnt/x/",
        "/mnt/a b",
        "/mnt/a,b",
        "/proc/x",
        "/etc/x",
        "/usr/local/x",
        "/dev/x",
        "/run/x",
        "/tmp/x",
        "/home/user",
        "/home/other/x",
        "/mnt/" + "x" * 100,
    ],
)
def test_bad_mount_paths_are_refused(path: str) -> None:
    with pytest.raises(InputValidationError, match="mount path"):
        validate_volumes({path: "data"})


def test_volumes_option_forms_and_limits() -> None:
    attaches = validate_volumes(
        {
            "/mnt/data": Volume("data", 64),
            "/home/user/ref": VolumeMount("ref", read_only=True),
            "/srv/x": Volume("x", 64).read_only(),
        }
    )
    assert attaches == (
        VolumeAttach("/mnt/data", "data", False),
        VolumeAttach("/home/user/ref", "ref", True),
        VolumeAttach("/srv/x", "x", True),
    )
    assert kernel_cmdline(attaches) == (
        "sbx.vola=rw:/mnt/data sbx.volb=ro:/home/user/ref sbx.volc=ro:/srv/x"
    )
    with pytest.raises(InputValidationError, match="at most 3"):
        validate_volumes({f"/mnt/{i}": f"v{i}" for i in range(4)})
    with pytest.raises(InputValidationError, match="twice"):
        validate_volumes({"/mnt/a": "data", "/mnt/b": "data"})
    with pytest.raises(InputValidationError, match="nest"):
        validate_volumes({"/mnt/a": "one", "/mnt/a/b": "two"})
    with pytest.raises(InputValidationError):
        validate_volumes(["/mnt/data"])
    assert parse_volume_option("/mnt/data=data:ro") == ("/mnt/data", VolumeMount("data", True))
    assert parse_volume_option("/mnt/data=data") == ("/mnt/data", VolumeMount("data", False))
    with pytest.raises(InputValidationError):
        parse_volume_option("/mnt/data=data:rx")


def test_one_writer_or_many_readers(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    writer = store.claim_sync(rw("data"))
    with pytest.raises(VolumeInUseError, match="attached read-write by another sandbox"):
        store.claim_sync(rw("data"))
    with pytest.raises(VolumeInUseError, match="attached read-write by another sandbox"):
        store.claim_sync(ro("data"))
    writer.close()
    readers = [store.claim_sync(ro("data")), store.claim_sync(ro("data"))]
    with pytest.raises(VolumeInUseError, match="attached read-only by another sandbox"):
        store.claim_sync(rw("data"))
    for reader in readers:
        reader.close()
    store.claim_sync(rw("data")).close()


def test_the_lock_holds_across_processes_and_goes_with_its_holder(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from exec_sandbox.volumes import VolumeAttach, VolumeStore\n"
            f"claims = VolumeStore(Path({str(tmp_path)!r})).claim_sync("
            "(VolumeAttach('/mnt/data', 'data', False),))\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(VolumeInUseError):
            store.claim_sync(ro("data"))
    finally:
        holder.kill()
        holder.wait()
    store.claim_sync(rw("data")).close()  # the kernel dropped the dead holder's lock


def test_a_claim_gives_the_locked_file_itself_to_the_vm(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    store.create_sync("ref", 64)
    claims = store.claim_sync(
        (VolumeAttach("/mnt/a", "data", False), VolumeAttach("/mnt/b", "ref", True))
    )
    try:
        disks = claims.disks()
        assert [(kind, writable) for kind, _, writable in disks] == [
            ("vola", True),
            ("volb", False),
        ]
        for (_, path, _), name in zip(disks, ("data", "ref"), strict=True):
            assert os.stat(path).st_ino == (tmp_path / f"{name}.img").stat().st_ino
        assert claims.read_write
    finally:
        claims.close()
    assert claims.fds == []
    claims.close()  # idempotent


def test_claims_are_all_or_none(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    with pytest.raises(VolumeError, match="no volume 'missing'"):
        store.claim_sync(
            (VolumeAttach("/mnt/a", "data", False), VolumeAttach("/mnt/b", "missing", False))
        )
    store.claim_sync(rw("data")).close()  # the first lock was given back


def test_delete_is_refused_while_attached(tmp_path: Path) -> None:
    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    claims = store.claim_sync(ro("data"))
    with pytest.raises(VolumeInUseError, match="attached"):
        store.delete_sync("data")
    claims.close()
    assert store.delete_sync("data") is True
    assert store.delete_sync("data") is False
    assert store.list_sync() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_a_paused_sessions_hold_refuses_writers_until_its_snapshot_is_gone(tmp_path: Path) -> None:
    live = {"a" * 32}
    store = VolumeStore(tmp_path, lambda snapshot_id: snapshot_id in live)
    store.create_sync("data", 64)
    with pytest.raises(VolumeError, match="read-only"):
        store.hold_for_snapshot_sync("a" * 32, rw("data"))
    store.hold_for_snapshot_sync("a" * 32, ro("data"))
    assert store.snapshot_volumes_sync("a" * 32) == ro("data")
    store.claim_sync(ro("data")).close()  # readers are fine
    with pytest.raises(VolumeInUseError, match="paused session a{32}"):
        store.claim_sync(rw("data"))
    with pytest.raises(VolumeInUseError, match="paused session"):
        store.delete_sync("data")
    live.clear()  # the snapshot expired: its hold is stale, and goes
    store.claim_sync(rw("data")).close()
    assert store.snapshot_volumes_sync("a" * 32) == ()
    store.hold_for_snapshot_sync("b" * 32, ro("data"))
    store.release_snapshot_sync("b" * 32)
    assert store.delete_sync("data") is True


# The jail's QEMU user in these tests: any uid that is not ours (nobody, as on a host where
# `sbx setup` has not run).
QEMU_IDS = (65534, 65534)


def _opens_as_qemu(path: Path, flags: int) -> bool:
    """Whether a process of QEMU's uid and gid (QEMU_IDS, no other group) that holds the image
    open can reopen it through /proc/self/fd/N with flags, as the jailed QEMU does."""
    held = os.open(path, os.O_RDONLY)
    try:
        pid = os.fork()
        if pid == 0:  # the child: only async-signal-safe work, then _exit
            code = 1
            try:
                os.setgroups([])
                os.setresgid(QEMU_IDS[1], QEMU_IDS[1], QEMU_IDS[1])
                os.setresuid(QEMU_IDS[0], QEMU_IDS[0], QEMU_IDS[0])
                os.close(os.open(f"/proc/self/fd/{held}", flags))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(held)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a file to another uid needs root")
def test_images_are_the_hosts_again_once_no_vm_has_them(tmp_path: Path) -> None:
    """A root caller's QEMU runs as its own user and must open the image it is given; once no
    VM has it, the image is the host user's again, 0600: an image left to the QEMU user (shared
    by every QEMU, `nobody` without `sbx setup`) would stay readable and writable by that user's
    processes outside any jail wherever volume_dir can be reached."""
    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    image = tmp_path / "data.img"
    writer = store.claim_sync(rw("data"))
    writer.give_to(*QEMU_IDS)
    assert _opens_as_qemu(image, os.O_RDWR)  # the jailed QEMU reopens it read-write
    writer.close()
    st = image.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (os.geteuid(), os.getegid(), 0o600)
    assert not _opens_as_qemu(image, os.O_RDONLY)

    readers = [store.claim_sync(ro("data")), store.claim_sync(ro("data"))]
    for reader in readers:
        reader.give_to(*QEMU_IDS)
    # A reader's QEMU reads the image and cannot write it, even by reopening it: it is not the
    # owner (who could chmod it back), only in the group.
    assert _opens_as_qemu(image, os.O_RDONLY)
    assert not _opens_as_qemu(image, os.O_RDWR)
    readers[0].close()
    assert _opens_as_qemu(image, os.O_RDONLY)  # the other reader's QEMU still needs it
    readers[1].close()
    st = image.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (os.geteuid(), os.getegid(), 0o600)
    assert not _opens_as_qemu(image, os.O_RDONLY)


def test_a_hold_counts_for_a_store_of_another_snapshot_cache(tmp_path: Path) -> None:
    """Schedulers (and `sbx volume`) with other memory_snapshot_cache_dirs may share one
    volume_dir: a hold is stale only when its own snapshot is gone, not when the snapshot is
    absent from the cache of whoever looks. Otherwise a writer (or `sbx volume rm`) through
    another cache dropped the hold and changed the disk a paused session has mounted."""
    volumes, one, other = tmp_path / "volumes", tmp_path / "cache-a", tmp_path / "cache-b"
    snapshot_id = "c" * 32
    (one / snapshot_id).mkdir(parents=True)
    other.mkdir()
    holder = VolumeStore.beside_sessions(volumes, one)
    holder.create_sync("data", 64)
    holder.hold_for_snapshot_sync(snapshot_id, ro("data"))
    elsewhere = VolumeStore.beside_sessions(volumes, other)
    with pytest.raises(VolumeInUseError, match=f"paused session {snapshot_id}"):
        elsewhere.claim_sync(rw("data"))
    with pytest.raises(VolumeInUseError, match="paused session"):
        elsewhere.delete_sync("data")
    assert elsewhere.snapshot_volumes_sync(snapshot_id) == ro("data")
    (one / snapshot_id).rmdir()  # the snapshot is gone: its hold is stale for everyone
    elsewhere.claim_sync(rw("data")).close()
    assert holder.snapshot_volumes_sync(snapshot_id) == ()


def test_a_hold_read_back_is_checked_like_volumes_given_by_the_caller(tmp_path: Path) -> None:
    """A hold's entries become the resumed VM's kernel command line words: a path or name
    that volumes= would refuse (a space starts another word) is an unreadable hold, never a
    word of the command line."""
    store = VolumeStore(tmp_path)
    claims = tmp_path / "claims"
    claims.mkdir()
    for entry in (["/mnt/x init=/bin/sh", "data", True], ["/etc/x", "data", True]):
        (claims / f"{'d' * 32}.json").write_text(json.dumps({"volumes": [entry]}))
        with pytest.raises(VolumeError, match="unreadable volume claim"):
            store.snapshot_volumes_sync("d" * 32)


def test_a_reader_that_comes_as_the_last_reader_leaves_is_not_refused(tmp_path: Path) -> None:
    """The last reader of an image holds it exclusively for a moment as it leaves (to give it
    back to the host user): a reader claiming then waits that moment out; a writer's hold is
    still a refusal."""
    import fcntl
    import threading

    store = VolumeStore(tmp_path)
    store.create_sync("data", 64)
    leaving = os.open(tmp_path / "data.img", os.O_RDONLY)
    fcntl.flock(leaving, fcntl.LOCK_EX)
    threading.Timer(0.02, os.close, (leaving,)).start()
    store.claim_sync(ro("data")).close()
    writer = store.claim_sync(rw("data"))
    with pytest.raises(VolumeInUseError, match="attached read-write"):
        store.claim_sync(ro("data"))
    writer.close()
