"""The work disk (docs/design.md, "Workspace"): /home/user and /tmp on a per-VM disk, in real
VMs, through every way a VM is started (cold boot, L1 restore, the warm pool, resume, fork, a
template)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exec_sandbox import InputValidationError, Run, Scheduler
from tests.helpers import private_config, qemu_processes

pytestmark = pytest.mark.vm

# Where /home/user and /tmp live, and how full: "ext2/ext3" is stat's name for ext4 (a tmpfs
# says "tmpfs").
FS_TYPES = "stat -f -c %T /home/user /tmp"


@pytest.fixture
async def ws(tmp_path: Path, images_ready: None) -> AsyncIterator[Scheduler]:
    # Four: a forked session and three copies at once.
    async with Scheduler(private_config(tmp_path, max_concurrent_vms=4)) as scheduler:
        yield scheduler
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"


def _disk_fds(directory: Path) -> list[str]:
    """This process's fds open on a file of directory (a work disk: O_TMPFILE, "#N (deleted)"),
    as /proc/self/fd paths."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{directory}/"):
            found.append(f"/proc/self/fd/{fd}")
    return found


def _allocated_mb(path: str) -> float:
    return os.stat(path).st_blocks * 512 / (1 << 20)


async def test_a_1gb_file_in_a_default_session(ws: Scheduler) -> None:
    # dd from /dev/zero writes real blocks (QEMU does not detect zeros, ext4 has no
    # compression): 1 GiB through the file system of a VM of 192 MB RAM, which a tmpfs (RAM)
    # could never hold, then read back, most of it from the disk (the page cache is ~150 MB).
    async with await ws.session(language="raw") as session:
        assert ws.config.default_memory_mb == 192
        result = await session.exec(
            f"{FS_TYPES} && dd if=/dev/zero of=/home/user/big bs=1M count=1024 conv=fsync "
            "2>/dev/null && stat -c %s /home/user/big && "
            "dd if=/home/user/big bs=1M 2>/dev/null | wc -c",
            timeout_seconds=300,
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split() == ["ext2/ext3", "ext2/ext3"] + [str(1 << 30)] * 2


async def test_a_400mb_file_round_trip_in_a_default_session(ws: Scheduler, tmp_path: Path) -> None:
    content = os.urandom(1 << 20) * 400  # 400 MiB, each MiB the same random one
    source = tmp_path / "in.bin"
    source.write_bytes(content)
    back = tmp_path / "out.bin"
    async with await ws.session(language="raw") as session:
        await session.write_file("data/in.bin", source)
        size = await session.exec("stat -c %s /home/user/data/in.bin")
        assert size.stdout.strip() == str(len(content))
        await session.read_file("data/in.bin", destination=back)
    assert back.stat().st_size == len(content) and back.read_bytes() == content


async def test_a_full_workspace_is_enospc_to_the_code(ws: Scheduler) -> None:
    async with await ws.session(language="raw", disk_mb=64) as session:
        result = await session.exec(
            "dd if=/dev/zero of=/home/user/fill bs=1M count=100 2>&1; echo rc=$?; "
            "df -m /home/user | tail -1"
        )
        assert "No space left on device" in result.stdout and "rc=1" in result.stdout
        # The VM goes on: what was written is there, and the space comes back when freed.
        after = await session.exec("rm /home/user/fill && echo ok > /tmp/x && cat /tmp/x")
        assert after.stdout == "ok\n"


async def test_disk_mb_is_validated_before_any_vm_starts(ws: Scheduler) -> None:
    for bad in (0, 63, 1024 * 1024 + 1, "64", True):
        with pytest.raises(InputValidationError, match="disk_mb"):
            await ws.run("true", language="raw", disk_mb=bad)  # type: ignore[arg-type]
    assert qemu_processes(parent=os.getpid()) == []


async def test_the_disk_survives_pause_and_resume_in_a_new_process(
    tmp_path: Path, images_ready: None
) -> None:
    write = "head -c 50000000 /dev/urandom > /home/user/blob && md5sum < /home/user/blob"
    async with Scheduler(private_config(tmp_path)) as first:
        session = await first.session(language="raw", disk_mb=512)
        digest = (await session.exec(write)).stdout
        paused = await session.pause()
    disk = tmp_path / "memory" / "sessions" / paused.id / "disk"
    assert disk.stat().st_size == 512 << 20 and disk.stat().st_mode & 0o077 == 0
    # Another Python process resumes it twice: a snapshot resumes more than once, each time
    # from a copy of its disk: the first one's rm does not reach the second.
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from exec_sandbox import Scheduler, SchedulerConfig\n"
        "async def main():\n"
        "    config = SchedulerConfig(memory_snapshots=False, memory_snapshot_cache_dir=Path(sys.argv[1]))\n"  # noqa: E501
        "    async with Scheduler(config) as s:\n"
        "        for _ in range(2):\n"
        "            async with await s.resume(sys.argv[2]) as session:\n"
        "                check = 'md5sum < /home/user/blob; rm /home/user/blob'\n"
        "                print((await session.exec(check)).stdout, end='')\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        str(tmp_path / "memory"),
        paused.id,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert out.decode().splitlines() == [digest.strip()] * 2, err.decode()[-2000:]


async def test_two_forks_write_the_same_path_and_each_sees_its_own(ws: Scheduler) -> None:
    async with await ws.session(language="raw") as parent:
        await parent.exec("echo parent > /home/user/who && echo tmp > /tmp/kept")
        (one,) = await parent.fork(1)
        two, three = await parent.fork(2)
        async with one, two, three:
            for name, session in (("one", one), ("two", two), ("three", three)):
                await session.exec(f"echo {name} > /home/user/who")
            await parent.exec("echo parent-after > /home/user/who")
            for name, session in (
                ("one", one),
                ("two", two),
                ("three", three),
                ("parent-after", parent),
            ):
                seen = await session.exec("cat /home/user/who /tmp/kept")
                assert seen.stdout == f"{name}\ntmp\n", name


def _disk_inodes(directory: Path) -> dict[int, float]:
    """The work disks this process holds open in directory: inode -> MB allocated."""
    return {os.stat(p).st_ino: _allocated_mb(p) for p in _disk_fds(directory)}


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="forks copy disks without qemu-img")
async def test_a_fork_copies_nothing_of_what_the_disk_holds(ws: Scheduler) -> None:
    """Copy on write: the fork's files are overlays of a few hundred KB on the parent's frozen
    disk, which holds the 64 MB; every VM still reads it all and writes only its own overlay.
    Forks of the copy and a pause/resume of it keep the frozen disk beneath."""
    disks = ws.config.memory_snapshot_cache_dir / "disks"
    digest = "md5sum < /home/user/big"
    async with await ws.session(language="raw") as parent:
        await parent.exec("head -c 64000000 /dev/urandom > /home/user/big && sync")
        want = (await parent.exec(digest)).stdout
        before = _disk_inodes(disks)
        (child,) = await parent.fork(1)
        async with child:
            made = {ino: mb for ino, mb in _disk_inodes(disks).items() if ino not in before}
            assert len(made) == 2, made  # the parent's overlay and the copy's
            assert all(mb < 4 for mb in made.values()), made
            assert (await child.exec(digest)).stdout == want
            await child.exec(
                "echo child > /home/user/mine && head -c 8000000 /dev/urandom >> /home/user/big"
            )
            await parent.exec("echo parent > /home/user/mine")
            assert (await parent.exec(digest)).stdout == want
            (grand,) = await child.fork(1)
            async with grand:
                assert (await grand.exec("cat /home/user/mine")).stdout == "child\n"
                assert (await grand.exec(digest)).stdout == (await child.exec(digest)).stdout
            snapshot = await child.pause()
        resumed = await ws.resume(snapshot.id)
        async with resumed:
            assert (await resumed.exec("cat /home/user/mine")).stdout == "child\n"
            assert (await resumed.exec("wc -c < /home/user/big")).stdout == "72000000\n"
        assert (await parent.exec("cat /home/user/mine")).stdout == "parent\n"


async def test_the_disk_is_gone_when_the_vm_is(ws: Scheduler) -> None:
    disks = ws.config.memory_snapshot_cache_dir / "disks"
    session = await ws.session(language="raw")
    await session.exec("head -c 20000000 /dev/urandom > /home/user/f && sync")
    (disk,) = _disk_fds(disks)  # the host's: nameless (O_TMPFILE), open while it runs
    assert [p.name for p in disks.iterdir()] == []
    assert _allocated_mb(disk) > 19  # sparse: it takes what the guest wrote
    # A deleted file gives its blocks back to the host (discard in the guest, unmap in QEMU).
    await session.exec("rm /home/user/f && sync && sleep 1")
    assert _allocated_mb(disk) < 10
    await session.close()
    assert _disk_fds(disks) == []
    result = await ws.run("ls /home/user", language="raw")  # a new VM: an empty disk
    assert result.stdout == ""
    await asyncio.sleep(0.1)  # run() destroys its VM on the loop's next turn
    assert _disk_fds(disks) == [] and [p.name for p in disks.iterdir()] == []


async def test_l1_restored_and_pooled_vms_have_their_own_disk(
    tmp_path: Path, images_ready: None
) -> None:
    check = f"{FS_TYPES}; cat /home/user/mark 2>/dev/null; echo x > /home/user/mark"
    results = []
    async with Scheduler(private_config(tmp_path, memory_snapshots=True)) as sched:
        assert await sched.prepare_snapshot("raw")
        for _ in range(2):
            results.append(await sched.run(check, language="raw"))
            assert results[-1].l1_cache_hit
    # The pool of another scheduler fills from the snapshot its predecessor left.
    config = private_config(tmp_path, memory_snapshots=True, warm_pool_size={"raw": 1})
    async with Scheduler(config) as sched:
        await sched.wait_pool_ready(timeout=120)
        results.append(await sched.run(check, language="raw"))
        assert results[-1].warm_pool_hit and results[-1].l1_cache_hit
    for result in results:
        # ext4, and no mark of another VM: each restored VM got its own copy of the disk
        # the snapshot's VM formatted
        assert result.stdout.split() == ["ext2/ext3", "ext2/ext3"], result.stdout


async def test_a_template_session_works_on_the_disk(tmp_path: Path, images_ready: None) -> None:
    config = private_config(tmp_path, template_build_memory_mb=2048)
    async with Scheduler(config) as sched:
        await sched.build_template("ws", steps=[Run("mkdir -p /srv && echo image > /srv/made")])
        async with await sched.session(language="raw", template="ws") as session:
            result = await session.exec(
                f"{FS_TYPES}; cat /srv/made; "
                "head -c 300000000 /dev/zero > /home/user/big && stat -c %s /home/user/big && "
                "head -c 100000000 /dev/zero > /tmp/big && stat -c %s /tmp/big"
            )
            assert result.stdout.split() == [
                "ext2/ext3",
                "ext2/ext3",
                "image",
                "300000000",
                "100000000",
            ], result.stdout + result.stderr


async def test_a_full_host_disk_is_an_io_error_in_the_guest_and_the_vm_goes_on(
    tmp_path: Path, images_ready: None
) -> None:
    # The cache's file system is a 120 MB tmpfs: the guest's 512 MB disk outgrows it. QEMU
    # reports the failed writes to the guest (werror=report) instead of pausing the VM.
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=120m tmpfs {small}") != 0:
        pytest.skip("needs root to mount a small tmpfs as the cache's file system")
    try:
        config = private_config(tmp_path, memory_snapshot_cache_dir=small)
        async with Scheduler(config) as sched:
            async with await sched.session(language="raw", disk_mb=512) as session:
                fill = await session.exec(
                    "dd if=/dev/urandom of=/home/user/f bs=1M count=300 conv=fsync 2>&1; "
                    "echo rc=$?",
                    timeout_seconds=300,
                )
                assert "Input/output error" in fill.stdout and "rc=1" in fill.stdout
                # Deleting gives the host its space back (discard): the VM writes again.
                again = await session.exec(
                    "rm /home/user/f && sync && sleep 1 && head -c 50000000 /dev/zero > "
                    "/home/user/g && sync && stat -c %s /home/user/g"
                )
                assert again.stdout == "50000000\n", again.stdout + again.stderr
    finally:
        os.system(f"umount {small}")
