"""Session file I/O in real microVMs: byte-identical round trips, interplay with the code, and the
paths that must be refused."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from exec_sandbox import FileInfo, InputValidationError, Scheduler

pytestmark = pytest.mark.vm

SIZES = [0, 1, 60 * 1024, 64 * 1024 + 1, 256 * 1024, 1024 * 1024 + 3, 50 * 1024 * 1024]


async def test_round_trips_are_byte_identical(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        all_bytes = bytes(range(256)) * 4
        await session.write_file("all.bin", all_bytes)
        assert await session.read_file("all.bin") == all_bytes
        for size in SIZES:
            data = os.urandom(size)
            await session.write_file(f"sizes/{size}.bin", data)
            back = await session.read_file(f"sizes/{size}.bin")
            assert back is not None and len(back) == size
            assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
            # The guest sees the same bytes too.
            seen = await session.exec(
                f"import hashlib; print(hashlib.sha256(open('sizes/{size}.bin','rb').read())"
                ".hexdigest())"
            )
            assert seen.stdout.strip() == hashlib.sha256(data).hexdigest()
            await session.exec(f"import os; os.remove('sizes/{size}.bin')")


async def test_files_cross_between_host_and_code(scheduler: Scheduler, tmp_path: Path) -> None:
    async with await scheduler.session(language="python") as session:
        await session.write_file("/home/user/in/data.txt", b"from host\n")
        result = await session.exec(
            "import os\nprint(open('in/data.txt').read(), end='')\n"
            "print(os.stat('in/data.txt').st_uid)\n"
            "open('out.txt', 'wb').write(b'from code')"
        )
        assert result.stdout == "from host\n1000\n"
        assert await session.read_file("out.txt") == b"from code"
        # Path and file-object sources and destinations.
        source = tmp_path / "src.bin"
        source.write_bytes(b"\x00\x01path")
        await session.write_file("p.bin", source)
        await session.write_file("io.bin", io.BytesIO(b"stream"))
        dest = tmp_path / "dest.bin"
        assert await session.read_file("p.bin", destination=dest) is None
        assert dest.read_bytes() == b"\x00\x01path"
        sink = io.BytesIO()
        await session.read_file("io.bin", destination=sink)
        assert sink.getvalue() == b"stream"
        listing = {entry.name: entry for entry in await session.list_files()}
        assert listing["io.bin"] == FileInfo("io.bin", False, 6)
        assert listing["in"].is_dir and not listing["out.txt"].is_dir
        assert [e.name for e in await session.list_files("in")] == ["data.txt"]


async def test_make_executable_sets_the_mode(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        await session.write_file("run.sh", b"#!/bin/bash\necho ran\n", make_executable=True)
        await session.write_file("plain.txt", b"x")
        result = await session.exec("./run.sh; test -x plain.txt || echo not-executable")
        assert result.stdout == "ran\nnot-executable\n"


async def test_aborted_write_leaves_no_file(scheduler: Scheduler) -> None:
    class Failing(io.RawIOBase):
        calls = 0

        def read(self, n: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 2:
                raise OSError("source broke")
            return b"x" * n

    async with await scheduler.session(language="python") as session:
        await session.write_file("keep.txt", b"old")
        with pytest.raises(OSError, match="source broke"):
            await session.write_file("keep.txt", Failing())
        with pytest.raises(OSError, match="source broke"):
            await session.write_file("new.txt", Failing())
        assert await session.read_file("keep.txt") == b"old"
        assert [e.name for e in await session.list_files()] == ["keep.txt"]


@pytest.mark.parametrize(
    "path",
    ["../escape", "/etc/passwd", "a/../../x", "a/..", "x\x00y", "n" * 256, "", "/home/user"],
)
async def test_lexically_bad_paths_are_refused_before_sending(
    scheduler: Scheduler, path: str
) -> None:
    async with await scheduler.session(language="raw") as session:
        with pytest.raises(InputValidationError):
            await session.write_file(path, b"x")
        with pytest.raises(InputValidationError):
            await session.read_file(path)
        if path not in ("", "/home/user"):
            with pytest.raises(InputValidationError):
                await session.list_files(path)
        assert (await session.exec("echo alive")).stdout == "alive\n"


async def test_symlink_escapes_are_refused_by_the_guest(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        await session.exec("ln -s /etc etc_link; ln -s /etc/passwd passwd_link; mkdir d")
        for path in ("etc_link/passwd", "passwd_link"):
            with pytest.raises(InputValidationError):
                await session.read_file(path)
        with pytest.raises(InputValidationError):
            await session.write_file("etc_link/planted", b"x")
        with pytest.raises(InputValidationError):
            await session.list_files("etc_link")
        # Writing over a symlink replaces the link, never the file it points to.
        await session.write_file("passwd_link", b"mine")
        result = await session.exec("test -L passwd_link || cat passwd_link; head -c 5 /etc/passwd")
        assert result.stdout == "mineroot:"
        with pytest.raises(FileNotFoundError):
            await session.read_file("d/missing")
        assert (await session.exec("echo alive")).stdout == "alive\n"
