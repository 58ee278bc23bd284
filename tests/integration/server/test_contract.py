"""The Scheduler contract, run against every way of reaching one: the local Scheduler, and
RemoteScheduler through a real `sbx serve` on its Unix socket and on TCP with a token. Each test
states one behaviour of the public API (README, docs/design.md) and must hold for all three: an
integration written against SandboxScheduler works with any of them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the remote extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")

from exec_sandbox import (
    EnvVarValidationError,
    InputValidationError,
    OutputLimitError,
    PackageNotAllowedError,
    Scheduler,
    SchedulerConfig,
    SessionClosedError,
    SnapshotError,
)
from exec_sandbox.limits import STDOUT_LIMIT_BYTES
from exec_sandbox.protocols import SandboxScheduler
from exec_sandbox.remote import RemoteScheduler
from tests.integration.network.test_exposed_ports import SERVE_PY, host_get
from tests.package_index import LocalIndex, make_wheel

from .support import Server, running

pytestmark = pytest.mark.vm

BACKENDS = ["local", "unix", "tcp"]
# A package no other index has: the server's package cache is the user's (shared with the other
# VM tests, for their warm memory snapshots), so the test's own wheel must not shadow a real
# project there.
INDEX_PACKAGE = ("sbxremotepkg", "1.0.0")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIndex]:
    root = tmp_path_factory.mktemp("index")
    name, version = INDEX_PACKAGE
    with LocalIndex(root / "index") as served:
        served.publish(make_wheel(root, name, version, {f"{name}.py": f"V = '{version}'\n"}))
        yield served


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, index: LocalIndex) -> Iterator[Server]:
    """This module's server, its host pip pointed at the loopback index (for install())."""
    with contextlib.ExitStack() as stack:
        with _environ(index.pip_env()):
            started = stack.enter_context(running(tmp_path_factory.mktemp("serve")))
        yield started


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    return server.token("contract", scope="admin")


@pytest.fixture(params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[SandboxScheduler]:
    """One scheduler of each kind; every session a test leaves open is closed by close()."""
    if request.param == "local":
        # Volumes in the test's own directory, as the server's (support.py): not the user's.
        volumes = request.getfixturevalue("tmp_path") / "volumes"
        async with Scheduler(SchedulerConfig(max_concurrent_vms=3, volume_dir=volumes)) as local:
            yield local
        return
    server: Server = request.getfixturevalue("server")
    if request.param == "unix":
        remote = RemoteScheduler(server.socket)
    else:
        token = request.getfixturevalue("token")
        remote = RemoteScheduler(f"http://127.0.0.1:{server.port}", token)
    async with remote:
        yield remote
    # Closing the client closed what it opened, on the server too.
    async with RemoteScheduler(server.socket) as check:
        assert [s["id"] for s in await check.sessions() if not s["closed"]] == []


# --- run() ---


async def test_run_returns_stdout_stderr_and_exit_code(sandbox: SandboxScheduler) -> None:
    result = await sandbox.run(
        "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    )
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert result.timing.total_ms > 0


async def test_run_timeout_is_exit_minus_one(sandbox: SandboxScheduler) -> None:
    result = await sandbox.run("import time; time.sleep(60)", timeout_seconds=1)
    assert result.exit_code == -1 and result.timed_out
    assert "timed out" in result.stderr


async def test_a_syntax_error_is_a_result_not_an_exception(sandbox: SandboxScheduler) -> None:
    result = await sandbox.run("def broken(:\n    pass")
    assert result.exit_code != 0
    assert "SyntaxError" in result.stderr


async def test_stdout_over_the_limit_raises_output_limit(sandbox: SandboxScheduler) -> None:
    with pytest.raises(OutputLimitError) as info:
        await sandbox.run(
            "import sys\nprint('to stderr', file=sys.stderr, flush=True)\n"
            "for _ in range(40): sys.stdout.write('x' * 32768)"
        )
    # The output up to the limit is kept on the exception, through the server too.
    assert 0 < len(info.value.stdout) <= STDOUT_LIMIT_BYTES
    assert set(info.value.stdout) == {"x"}
    assert info.value.stderr == "to stderr\n"


async def test_output_streams_to_the_callbacks_as_it_is_written(
    sandbox: SandboxScheduler,
) -> None:
    out: list[str] = []
    err: list[str] = []
    result = await sandbox.run(
        "import sys, time\nprint('first', flush=True)\ntime.sleep(0.3)\n"
        "print('oops', file=sys.stderr, flush=True)\nprint('last')",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == result.stdout == "first\nlast\n"
    assert "".join(err) == result.stderr == "oops\n"
    assert len(out) >= 2  # two writes 0.3 s apart arrive as two chunks


async def test_bad_input_raises_the_same_error_before_any_vm(sandbox: SandboxScheduler) -> None:
    with pytest.raises(InputValidationError):
        await sandbox.run("print(1)", language="cobol")  # type: ignore[arg-type]
    with pytest.raises(EnvVarValidationError):
        await sandbox.run("print(1)", env_vars={"NOT=VALID": "1"})
    with pytest.raises(PackageNotAllowedError):
        await sandbox.session(packages=["requests"])  # not pinned
    with pytest.raises(InputValidationError):
        await sandbox.run("print(1)", timeout_seconds=0.001)


# --- sessions ---


async def test_session_state_env_and_exec_count(sandbox: SandboxScheduler) -> None:
    async with await sandbox.session(env_vars={"GREETING": "hi"}) as session:
        await session.exec("x = 41")
        result = await session.exec(
            "import os; print(x + 1, os.environ['GREETING'], os.environ['EXTRA'])",
            env_vars={"EXTRA": "per-call"},
        )
        assert result.stdout == "42 hi per-call\n"
        assert session.exec_count == 2 and not session.closed
        streamed: list[str] = []
        await session.exec("print(x)", on_stdout=streamed.append)
        assert "".join(streamed) == "41\n"


async def test_a_user_exception_keeps_the_session_and_its_state(
    sandbox: SandboxScheduler,
) -> None:
    async with await sandbox.session() as session:
        await session.exec("kept = 'yes'")
        failed = await session.exec("raise ValueError('boom')")
        assert failed.exit_code != 0 and "ValueError: boom" in failed.stderr
        assert (await session.exec("print(kept)")).stdout == "yes\n"


async def test_files_round_trip_through_bytes_paths_and_file_objects(
    sandbox: SandboxScheduler, tmp_path: Path
) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(300_000))
    async with await sandbox.session() as session:
        await session.write_file("a.txt", b"hello")
        await session.write_file("dir/b.bin", source)
        await session.write_file("c.sh", io.BytesIO(b"#!/bin/sh\necho ok\n"), make_executable=True)
        assert await session.read_file("a.txt") == b"hello"
        copy = tmp_path / "out.bin"
        assert await session.read_file("dir/b.bin", destination=copy) is None
        assert copy.read_bytes() == source.read_bytes()
        sink = io.BytesIO()
        await session.read_file("c.sh", destination=sink)
        assert sink.getvalue() == b"#!/bin/sh\necho ok\n"
        listed = {f.name: f for f in await session.list_files()}
        assert {"a.txt", "dir", "c.sh"} <= set(listed)
        assert listed["dir"].is_dir and listed["a.txt"].size == 5
        inner = await session.list_files("dir")
        assert [(f.name, f.size) for f in inner] == [("b.bin", 300_000)]
        ran = await session.exec(
            "import subprocess; print(subprocess.run(['./c.sh'], "
            "capture_output=True, text=True).stdout)"
        )
        assert ran.stdout == "ok\n\n"


async def test_install_from_the_hosts_index(sandbox: SandboxScheduler, index: LocalIndex) -> None:
    # The local Scheduler's host pip reads this process's environment; the server's got it
    # when it started.
    name, version = INDEX_PACKAGE
    with _environ(index.pip_env()):
        async with await sandbox.session() as session:
            report = await session.install([f"{name}=={version}"], timeout_seconds=120)
            assert report.packages == (f"{name}=={version}",)
            result = await session.exec(f"import {name}; print({name}.V)")
            assert result.stdout == f"{version}\n", result.stderr


async def test_pause_then_resume_brings_the_state_back(sandbox: SandboxScheduler) -> None:
    session = await sandbox.session()
    await session.exec("kept = [1, 2, 3]")
    snapshot = await session.pause()
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.exec("print(1)")
    try:
        assert snapshot.id in [s.id for s in await sandbox.snapshots()]
        async with await sandbox.resume(snapshot.id) as resumed:
            assert (await resumed.exec("print(sum(kept))")).stdout == "6\n"
    finally:
        assert await sandbox.delete_snapshot(snapshot.id)
    assert not await sandbox.delete_snapshot(snapshot.id)
    with pytest.raises(SnapshotError):
        await sandbox.resume(snapshot.id)


async def test_fork_copies_the_state_and_then_runs_apart(sandbox: SandboxScheduler) -> None:
    async with await sandbox.session() as session:
        await session.exec("n = 1")
        copy = await session.fork()
        assert not isinstance(copy, list)
        async with copy:
            await copy.exec("n += 10")
            assert (await copy.exec("print(n)")).stdout == "11\n"
            assert (await session.exec("print(n)")).stdout == "1\n"
            assert copy.session_id != session.session_id


async def test_a_closed_session_raises_session_closed(sandbox: SandboxScheduler) -> None:
    session = await sandbox.session()
    await session.close()
    await session.close()  # idempotent
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.exec("print(1)")
    with pytest.raises(SessionClosedError):
        await session.list_files()


# --- processes and terminals ---


async def test_spawned_process_output_and_kill(sandbox: SandboxScheduler) -> None:
    async with await sandbox.session() as session:
        process = await session.spawn(  # type: ignore[attr-defined]
            "echo out; echo err >&2; exec sleep 60"
        )
        reader = process.stdout.__aiter__()
        assert await asyncio.wait_for(reader.__anext__(), 30) == b"out\n"
        errors = process.stderr.__aiter__()  # written before the kill, not raced by it
        assert await asyncio.wait_for(errors.__anext__(), 30) == b"err\n"
        assert process.exit_code is None
        listed = await session.processes()  # type: ignore[attr-defined]
        assert process.pid in [p.pid for p in listed]
        await process.kill(signal.SIGTERM)
        assert await process.wait(30) == 128 + signal.SIGTERM
        assert await asyncio.wait_for(process.stderr.read(), 30) == b"err\n"


async def test_process_stdin_reaches_the_program(sandbox: SandboxScheduler) -> None:
    async with await sandbox.session() as session:
        process = await session.spawn(["cat"])  # type: ignore[attr-defined]
        await process.write_stdin("line one\n")
        await process.close_stdin()
        assert await process.wait(30) == 0
        assert await process.stdout.read() == b"line one\n"


async def test_terminal_runs_a_shell(sandbox: SandboxScheduler) -> None:
    async with await sandbox.session() as session:
        terminal = await session.terminal(100, 30)  # type: ignore[attr-defined]
        async with terminal:
            await terminal.resize(120, 40)
            await terminal.write("echo $((6 * 7)) $(stty size)\r")
            seen = b""
            while b"42 40 120" not in seen:
                chunk = await asyncio.wait_for(terminal.read(), 30)
                assert chunk, f"the terminal ended early: {seen!r}"
                seen += chunk
            await terminal.write("exit 5\r")
            assert await terminal.wait(30) == 5


# --- ports, volumes, templates ---


async def test_an_exposed_port_reaches_a_server_in_the_guest(sandbox: SandboxScheduler) -> None:
    async with await sandbox.session(expose_ports=[8000]) as session:
        (exposed,) = session.exposed_ports  # type: ignore[attr-defined]
        assert (exposed.internal, exposed.host) == (8000, "127.0.0.1")
        result = await session.exec(SERVE_PY)
        assert result.exit_code == 0, result.stderr
        assert await host_get(exposed.url + "/page.txt") == b"served by the guest\n"


async def test_a_volume_outlives_the_vm_that_wrote_it(sandbox: SandboxScheduler) -> None:
    volume = await sandbox.volume("contract-vol", size_mb=16)  # type: ignore[attr-defined]
    try:
        assert "contract-vol" in [v.name for v in await sandbox.volumes()]  # type: ignore[attr-defined]
        wrote = await sandbox.run(
            "open('/mnt/data/kept.txt', 'w').write('kept')", volumes={"/mnt/data": volume}
        )
        assert wrote.exit_code == 0, wrote.stderr
        read = await sandbox.run(
            "print(open('/mnt/data/kept.txt').read())",
            volumes={"/mnt/data": volume.read_only()},
        )
        assert read.stdout == "kept\n"
    finally:
        assert await sandbox.delete_volume("contract-vol")  # type: ignore[attr-defined]
    assert not await sandbox.delete_volume("contract-vol")  # type: ignore[attr-defined]


async def test_templates_are_listed_and_an_unknown_one_is_not_deleted(
    sandbox: SandboxScheduler,
) -> None:
    assert isinstance(await sandbox.templates(), list)  # type: ignore[attr-defined]
    assert not await sandbox.delete_template("no-such-template")  # type: ignore[attr-defined]
