"""Volumes in real VMs: content that outlives the VMs, one writer or many readers, deletion
refused while attached, bad arguments refused before any VM, sessions with volumes that are not
copied, and `sbx volume` / `sbx run --volume`. Each test has its own volume directory."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exec_sandbox import (
    InputValidationError,
    Run,
    Scheduler,
    SnapshotError,
    Volume,
    VolumeError,
    VolumeInUseError,
    VolumeMount,
)
from tests.helpers import private_config, qemu_processes
from tests.templates_support import BusyboxImage

pytestmark = pytest.mark.vm

WRITE = (
    "import os; open('/mnt/data/note.txt', 'w').write('kept'); print(os.stat('/mnt/data').st_uid)"
)
READ = "print(open('/mnt/data/note.txt').read())"


@pytest.fixture
async def vsched(tmp_path: Path, images_ready: None) -> AsyncIterator[Scheduler]:
    """A scheduler whose volumes (and caches) are the test's own."""
    async with Scheduler(private_config(tmp_path, volume_dir=tmp_path / "volumes")) as sched:
        yield sched
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"


async def test_a_volume_outlives_its_vm_and_is_read_by_two_readers_at_once(
    vsched: Scheduler, tmp_path: Path
) -> None:
    volume = await vsched.volume("data", size_mb=64)
    assert await vsched.volumes() == [volume]
    image = tmp_path / "volumes" / "data.img"
    # The first writer formats it; its root belongs to the sandbox user.
    first = await vsched.run(WRITE, volumes={"/mnt/data": volume})
    assert (first.exit_code, first.stdout, first.stderr) == (0, "1000\n", "")
    assert not first.warm_pool_hit and not first.l1_cache_hit
    # Two read-only sessions at once see it; neither may write.
    one = await vsched.session(volumes={"/mnt/data": volume.read_only()})
    two = await vsched.session(volumes={"/mnt/data": VolumeMount("data", read_only=True)})
    async with one, two:
        for session in (one, two):
            assert (await session.exec(READ)).stdout == "kept\n"
        denied = await one.exec("open('/mnt/data/other.txt', 'w')")
        assert denied.exit_code == 1 and "Read-only file system" in denied.stderr
        if os.geteuid() == 0:  # QEMU runs as its own user: it may read the image, not write it
            st = image.stat()
            assert (st.st_uid, st.st_mode & 0o777) == (0, 0o640)
    # A later writer, by name, under another path (and in bash).
    again = await vsched.run(
        "cat /home/user/vol/note.txt; echo more >> /home/user/vol/note.txt",
        language="raw",
        volumes={"/home/user/vol": "data"},
    )
    assert (again.exit_code, again.stdout) == (0, "kept"), again.stderr
    last = await vsched.run("print(open('/srv/d/note.txt').read())", volumes={"/srv/d": "data"})
    assert last.stdout == "keptmore\n\n"
    # No VM has it: the image is ours again, owner-only (not left to the QEMU user).
    st = image.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (os.geteuid(), os.getegid(), 0o600)


async def test_a_second_read_write_attach_is_refused(vsched: Scheduler) -> None:
    volume = await vsched.volume("data", size_mb=64)
    async with await vsched.session(volumes={"/mnt/data": volume}) as writer:
        with pytest.raises(VolumeInUseError, match="'data' is attached read-write"):
            await vsched.run("print(1)", volumes={"/mnt/data": volume})
        with pytest.raises(VolumeInUseError, match="'data' is attached read-write"):
            await vsched.run("print(1)", volumes={"/mnt/data": volume.read_only()})
        with pytest.raises(VolumeInUseError, match="attached to a running sandbox"):
            await vsched.delete_volume("data")
        assert (await writer.exec("print(2)")).stdout == "2\n"
    # Released with its VM: the volume can be attached again, and deleted.
    assert (await vsched.run("print(3)", volumes={"/mnt/data": volume})).stdout == "3\n"
    assert await vsched.delete_volume(volume) is True
    assert await vsched.volumes() == []
    with pytest.raises(VolumeError, match="no volume 'data'"):
        await vsched.run("print(1)", volumes={"/mnt/data": volume})


async def test_a_read_write_attach_waits_for_no_reader(vsched: Scheduler) -> None:
    await vsched.volume("data", size_mb=64)
    async with await vsched.session(volumes={"/mnt/data": VolumeMount("data", True)}):
        with pytest.raises(VolumeInUseError, match="attached read-only"):
            await vsched.run("print(1)", volumes={"/mnt/data": "data"})


async def test_bad_volume_arguments_are_refused_before_any_vm(vsched: Scheduler) -> None:
    await vsched.volume("data", size_mb=64)
    for volumes in (
        {"/etc/data": "data"},
        {"/home/user": "data"},
        {"/mnt/../x": "data"},
        {"relative/x": "data"},
        {"/mnt/data": "Bad Name"},
        {"/mnt/a": "data", "/mnt/b": "data"},
    ):
        with pytest.raises(InputValidationError):
            await vsched.run("print(1)", volumes=volumes)  # type: ignore[arg-type]
    assert qemu_processes(parent=os.getpid()) == []
    with pytest.raises(InputValidationError):
        await vsched.volume("Bad Name", size_mb=64)
    with pytest.raises(InputValidationError):
        await vsched.volume("data", size_mb=1)
    with pytest.raises(VolumeError, match="size_mb=64"):
        await vsched.volume("data", size_mb=128)
    assert (await vsched.volume("data")).size_mb == 64  # the existing one, by name
    with pytest.raises(VolumeError, match="give size_mb"):
        await vsched.volume("other")


async def test_a_session_with_volumes_is_not_forked_or_paused(vsched: Scheduler) -> None:
    volume = await vsched.volume("data", size_mb=64)
    async with await vsched.session(volumes={"/mnt/data": volume}) as session:
        await session.exec("x = 41")
        with pytest.raises(SnapshotError, match="read-write volumes .* cannot be forked"):
            await session.fork()
        with pytest.raises(SnapshotError, match="read-write volumes .* cannot be paused"):
            await session.pause()
        # Refused before anything was saved: the session goes on, state intact.
        assert (await session.exec("print(x + 1)")).stdout == "42\n"


async def test_volumes_are_mounted_in_a_templates_root(
    vsched: Scheduler, busybox_image: BusyboxImage
) -> None:
    await vsched.volume("data", size_mb=64)
    await vsched.build_template("bb", image=busybox_image.layout)
    wrote = await vsched.run(
        "echo from-template > /mnt/data/f; cat /mnt/data/f",
        language="raw",
        template="bb",
        volumes={"/mnt/data": "data"},
    )
    assert (wrote.exit_code, wrote.stdout) == (0, "from-template\n"), wrote.stderr
    # Read-only under the home, which the template binds from the agent.
    read = await vsched.run(
        "cat /home/user/v/f; echo x > /home/user/v/g || echo refused",
        language="raw",
        template="bb",
        volumes={"/home/user/v": VolumeMount("data", read_only=True)},
    )
    assert read.stdout == "from-template\nrefused\n", read.stderr
    # Outside the home, a template's link into one of the agent's binds (its run directory,
    # where the REPL's files live) is not a way to cover that bind with a volume.
    await vsched.build_template(
        "bb-link", base="bb", steps=[Run("mkdir -p /mnt && ln -s /run/sbx /mnt/link")]
    )
    with pytest.raises(Exception) as refused:
        await vsched.run(
            "ls /mnt/link/repl",
            language="raw",
            template="bb-link",
            volumes={"/mnt/link/repl": "data"},
        )
    assert "mounting volume /mnt/link/repl in the template" in str(refused.value)


async def test_a_session_with_read_only_volumes_forks_and_each_copy_holds_its_lock(
    vsched: Scheduler,
) -> None:
    volume = await vsched.volume("data", size_mb=64)
    await vsched.run(WRITE, volumes={"/mnt/data": volume})
    session = await vsched.session(volumes={"/mnt/data": volume.read_only()})
    copy = await session.fork()
    async with copy:
        await session.close()
        assert (await copy.exec(READ)).stdout == "kept\n"
        # The copy still reads it: no writer yet.
        with pytest.raises(VolumeInUseError, match="attached read-only"):
            await vsched.run("print(1)", volumes={"/mnt/data": volume})
    assert (await vsched.run("print(2)", volumes={"/mnt/data": volume})).stdout == "2\n"


async def test_a_paused_session_keeps_its_read_only_volumes_until_its_snapshot_goes(
    vsched: Scheduler,
) -> None:
    volume = await vsched.volume("data", size_mb=64)
    await vsched.run(WRITE, volumes={"/mnt/data": volume})
    session = await vsched.session(volumes={"/mnt/data": volume.read_only()})
    await session.exec("note = open('/mnt/data/note.txt')")
    snapshot = await session.pause()
    # Its saved memory has the volume mounted: no writer, no deletion, while it exists.
    with pytest.raises(VolumeInUseError, match=f"paused session {snapshot.id}"):
        await vsched.run("print(1)", volumes={"/mnt/data": volume})
    with pytest.raises(VolumeInUseError, match="paused session"):
        await vsched.delete_volume(volume)
    readers = await vsched.run(READ, volumes={"/mnt/data": volume.read_only()})
    assert readers.stdout == "kept\n"
    # Resumed (twice: a snapshot stays), with the volume at its path and the file still open.
    for _ in range(2):
        async with await vsched.resume(snapshot) as resumed:
            assert (await resumed.exec("print(note.read())")).stdout == "kept\n"
            assert (await resumed.exec(READ)).stdout == "kept\n"
    assert await vsched.delete_snapshot(snapshot)
    assert (await vsched.run("print(2)", volumes={"/mnt/data": volume})).stdout == "2\n"


def test_cli_creates_lists_attaches_and_removes_volumes(images_ready: None, tmp_path: Path) -> None:
    env = {**os.environ, "EXEC_SANDBOX_DATA_DIR": str(tmp_path / "data")}

    def sbx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "exec_sandbox.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    assert sbx("volume", "create", "notes", "--size-mb", "32").returncode == 0
    listing = sbx("volume", "list")
    assert listing.stdout.splitlines()[1].split()[:3] == ["notes", "32", "MB"]
    assert (tmp_path / "data" / "volumes" / "notes.img").stat().st_size == 32 << 20
    wrote = sbx("run", "-l", "raw", "--volume", "/mnt/n=notes", "-c", "echo hi > /mnt/n/f")
    assert wrote.returncode == 0, wrote.stderr
    read = sbx("run", "-l", "raw", "--volume", "/mnt/n=notes:ro", "-c", "cat /mnt/n/f")
    assert (read.returncode, read.stdout) == (0, "hi\n"), read.stderr
    bad = sbx("run", "--volume", "/etc/n=notes", "-c", "print(1)")
    assert bad.returncode == 2 and "mount path" in bad.stderr
    # A paused session holds its read-only volume until its snapshot is deleted.
    writable = sbx("session", "new", "--volume", "/mnt/n=notes", "-c", "print(1)")
    assert writable.returncode == 2 and "add :ro" in writable.stderr
    new = sbx(
        "session", "new", "--json", "--volume", "/mnt/n=notes:ro", "-c", "f = open('/mnt/n/f')"
    )
    assert new.returncode == 0, new.stderr
    snapshot_id = json.loads(new.stdout)["snapshot"]["id"]
    resumed = sbx("session", "resume", "--json", snapshot_id, "-c", "print(f.read(), end='')")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"]["stdout"] == "hi\n"
    held = sbx("volume", "rm", "notes")
    assert held.returncode == 125 and "paused session" in held.stderr
    assert sbx("session", "delete", json.loads(resumed.stdout)["snapshot"]["id"]).returncode == 0
    assert sbx("volume", "rm", "notes").returncode == 0
    assert "no volumes" in sbx("volume", "list").stdout
    assert sbx("volume", "rm", "notes").returncode == 1


def test_volume_is_exported(images_ready: None) -> None:
    # The user-facing names (API.md): Volume is a frozen value.
    volume = Volume("data", 64)
    with pytest.raises(AttributeError):
        volume.name = "other"  # type: ignore[misc]
    assert volume.read_only() == VolumeMount("data", read_only=True)
    assert asyncio.iscoroutinefunction(Scheduler.volume)


async def test_what_a_background_process_wrote_survives_close(vsched: Scheduler) -> None:
    # The guest settles volumes before an exec's EXIT; a spawned process (or a terminal)
    # writes outside any exec, and close() right after would drop it with the VM.
    volume = await vsched.volume("data", size_mb=64)
    async with await vsched.session(language="raw", volumes={"/mnt/data": volume}) as session:
        writer = await session.spawn(["sh", "-c", "echo kept > /mnt/data/bg.txt"])
        assert await writer.wait(timeout=30) == 0
    read = await vsched.run(
        "cat /mnt/data/bg.txt", language="raw", volumes={"/mnt/data": volume.read_only()}
    )
    assert read.stdout == "kept\n", read.stderr
