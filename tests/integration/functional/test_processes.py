"""Background processes (session.spawn / processes) in real VMs: a server reached through an
exposed port whose output is read later, stdin, signals, many short processes, a flood that the
host does not buffer, handles after pause -> resume and in forks, and what a closed session does
to operations in flight."""

from __future__ import annotations

import asyncio
import signal
import tracemalloc
import urllib.request
from pathlib import Path

import pytest

from exec_sandbox import (
    InputValidationError,
    OutputGap,
    ProcessError,
    Scheduler,
    SchedulerConfig,
    SessionClosedError,
)
from exec_sandbox.vm.binding import PROC
from tests.helpers import private_config

pytestmark = pytest.mark.vm

# A web server that also echoes its stdin: one process to reach through a port, to write to and
# to kill. Its "listening" line says when the port is open.
SERVER = r"""
import http.server, sys, threading
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"from a background process\n"
        self.send_response(200); self.end_headers(); self.wfile.write(body)
        print("served", self.path, flush=True)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 8000), Page)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("listening", flush=True)
for line in sys.stdin:
    print("echo:", line.strip(), flush=True)
"""


async def host_get(url: str) -> bytes:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: urllib.request.urlopen(url, timeout=30).read())


async def read_until(reader: object, needle: bytes, timeout: float = 60.0) -> bytes:
    """Chunks of an output reader until `needle` appeared (the reader stays where it stopped)."""
    seen = b""

    async def collect() -> None:
        nonlocal seen
        async for chunk in reader:  # type: ignore[attr-defined]
            seen += chunk
            if needle in seen:
                return
        raise AssertionError(f"stream ended before {needle!r}: {seen!r}")

    await asyncio.wait_for(collect(), timeout)
    return seen


async def test_a_background_server_is_reached_read_later_fed_and_killed(
    scheduler: Scheduler,
) -> None:
    async with await scheduler.session(expose_ports=[8000]) as session:
        server = await session.spawn(["python3", "-c", SERVER])
        assert server.pid > 1 and server.exit_code is None
        await read_until(server.stdout, b"listening\n")
        (exposed,) = session.exposed_ports
        assert await host_get(exposed.url + "/one") == b"from a background process\n"
        # Two unrelated executions in between: the process and its output stay.
        assert (await session.exec("print(6 * 7)")).stdout == "42\n"
        assert (await session.exec("x = 1")).exit_code == 0
        # A reader that comes later gets everything from the first byte.
        assert await read_until(server.stdout, b"served /one\n") == (b"listening\nserved /one\n")
        await server.write_stdin("ping\n")
        await read_until(server.stdout, b"echo: ping\n")
        info = await server.info()
        assert info.running and info.stdin_open and not info.pty
        assert info.command.startswith("python3 -c")
        await server.kill(signal.SIGTERM)
        assert await server.wait(timeout=30) == 128 + signal.SIGTERM
        assert server.returncode == 128 + signal.SIGTERM
        await server.kill()  # an ended process: nothing happens
        # The whole output ends now; stderr was empty.
        assert (await server.stdout.read()).endswith(b"echo: ping\n")
        assert await server.stderr.read() == b""


async def test_stdin_closed_ends_cat_and_env_cwd_reach_the_process(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw", env_vars={"FROM_SESSION": "s"}) as session:
        cat = await session.spawn(["cat"])
        await cat.write_stdin(b"x" * 200_000)  # more than one PROC_WRITE and one pipe
        await cat.close_stdin()
        assert await cat.wait(timeout=60) == 0
        assert await cat.stdout.read() == b"x" * 200_000
        with pytest.raises(BrokenPipeError):
            await cat.write_stdin(b"late")
        shown = await session.spawn(
            'echo "$PWD $FROM_SESSION $MINE"; exit 7', cwd="/tmp", env={"MINE": "m"}
        )
        assert await shown.wait(timeout=30) == 7
        assert await shown.stdout.read() == b"/tmp s m\n"


async def test_callbacks_get_the_output_sync_and_async(scheduler: Scheduler) -> None:
    got: list[bytes] = []
    errors: list[bytes] = []

    async def on_err(chunk: bytes) -> None:
        errors.append(chunk)

    async with await scheduler.session(language="raw") as session:
        proc = await session.spawn("echo out; echo err >&2", on_stdout=got.append, on_stderr=on_err)
        assert await proc.wait(timeout=30) == 0
        for _ in range(100):
            if got and errors:
                break
            await asyncio.sleep(0.1)
        assert b"".join(got) == b"out\n" and b"".join(errors) == b"err\n"


async def test_bad_input_is_refused_before_the_vm(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        for bad in ("", [], ["a", ""], ["a\0b"], [1], b"ls", ["x"] * (PROC["PROC_ARGV_MAX"] + 1)):
            with pytest.raises(InputValidationError):
                await session.spawn(bad)  # type: ignore[arg-type]
        with pytest.raises(InputValidationError):
            await session.spawn("true", cwd="relative")
        with pytest.raises(InputValidationError):
            await session.spawn("true", env={"BAD=NAME": "x"})
        with pytest.raises(InputValidationError):
            await session.terminal(0, 24)
        with pytest.raises(InputValidationError):
            await session.terminal(80, 1001)
        proc = await session.spawn(["sleep", "30"])
        with pytest.raises(InputValidationError):
            await proc.kill(0)
        with pytest.raises(InputValidationError):
            await proc.kill(65)
        await proc.kill(signal.SIGKILL)
        assert await proc.wait(timeout=30) == 128 + signal.SIGKILL
        # A program that does not exist is the guest's refusal, named.
        with pytest.raises(ProcessError, match="no-such-program"):
            await session.spawn(["no-such-program"])
        with pytest.raises(ProcessError, match="in /no/such/dir: chdir"):
            await session.spawn("true", cwd="/no/such/dir")
        # The session is unharmed by all of it.
        assert (await session.exec("echo ok")).stdout == "ok\n"


async def test_a_hundred_short_processes_are_listed_and_reaped(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        procs = [await session.spawn(["true"]) for _ in range(100)]
        assert len({p.pid for p in procs}) == 100
        assert [await p.wait(timeout=60) for p in procs] == [0] * 100
        listed = {p.pid: p for p in await session.processes()}
        assert {p.pid for p in procs} <= set(listed)
        assert all(listed[p.pid] is p and p.exit_code == 0 for p in procs)
        zombies = await session.exec(
            "import os\n"
            "print(sum(open(f'/proc/{p}/stat').read().split(') ')[1][0] == 'Z'\n"
            "          for p in os.listdir('/proc') if p.isdigit()))"
        )
        assert zombies.stdout == "0\n"


async def test_a_flood_is_kept_in_the_guest_not_on_the_host(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        total = 24 * 1024 * 1024
        flood = await session.spawn(f"head -c {total} /dev/zero | tr '\\0' y")
        assert await flood.wait(timeout=120) == 0
        assert (await flood.info()).stdout_bytes == total
        tracemalloc.start()
        try:
            chunks = [chunk async for chunk in flood.stdout]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        gap = chunks[0]
        assert isinstance(gap, OutputGap) and gap.dropped > 0
        kept = sum(len(c) for c in chunks[1:])
        assert not any(isinstance(c, OutputGap) for c in chunks[1:])
        assert gap.dropped + kept == total
        assert kept <= PROC["PROC_BUFFER_MAX"]
        assert flood.stdout_dropped == gap.dropped
        # Host memory while reading: the chunks this test kept, and no buffer of the flood.
        assert peak < kept + 2 * 1024 * 1024, peak


async def test_closing_the_session_fails_operations_in_flight(scheduler: Scheduler) -> None:
    session = await scheduler.session(language="raw")
    proc = await session.spawn(["sleep", "600"])
    reader = asyncio.ensure_future(proc.stdout.read())
    waiter = asyncio.ensure_future(proc.wait())
    await asyncio.sleep(0.5)
    assert not reader.done() and not waiter.done()
    await session.close()
    for task in (reader, waiter):
        with pytest.raises(SessionClosedError):
            await asyncio.wait_for(task, 10)
    with pytest.raises(SessionClosedError):
        await proc.info()
    with pytest.raises(SessionClosedError):
        await session.spawn("true")


async def test_a_reader_keeps_an_idle_session_open(images_ready: None) -> None:
    config = SchedulerConfig(max_concurrent_vms=1, session_idle_timeout_seconds=10)
    async with Scheduler(config) as scheduler, await scheduler.session(language="raw") as session:
        late = await session.spawn("sleep 14; echo late")
        assert await asyncio.wait_for(late.stdout.read(), 60) == b"late\n"
        assert not session.closed


async def test_processes_survive_pause_and_resume_and_forks(
    tmp_path: Path, images_ready: None
) -> None:
    config = private_config(tmp_path, memory_snapshots=True)
    async with Scheduler(config) as first:
        session = await first.session(language="raw")
        ticker = await session.spawn(
            'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 0.2; done'
        )
        await read_until(ticker.stdout, b"tick 2\n")
        pid = ticker.pid
        snapshot = await session.pause()
        with pytest.raises(SessionClosedError):
            await ticker.info()
    async with Scheduler(config) as second:
        resumed = await second.resume(snapshot.id)
        async with resumed:
            (again,) = [p for p in await resumed.processes() if p.pid == pid]
            assert again.command == ticker.command and again.exit_code is None
            # From the first byte: what it wrote before the pause, and on after the resume.
            seen = await read_until(again.stdout, b"tick 8\n")
            assert seen.startswith(b"tick 0\ntick 1\n")
            fork = await resumed.fork()
            async with fork:
                (copy,) = [p for p in await fork.processes() if p.pid == pid]
                assert copy is not again
                await copy.kill(signal.SIGKILL)
                assert await copy.wait(timeout=30) == 128 + signal.SIGKILL
                # The fork's process is its own: the original goes on.
                assert (await again.info()).running
            await again.kill()
            assert await again.wait(timeout=30) == 128 + signal.SIGTERM


async def test_processes_start_and_answer_while_an_exec_runs(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        long_exec = asyncio.ensure_future(session.exec("sleep 8; echo done"))
        await asyncio.sleep(1.0)
        proc = await session.spawn(["echo", "beside"])
        assert await proc.wait(timeout=30) == 0
        assert await proc.stdout.read() == b"beside\n"
        assert proc.pid in {p.pid for p in await session.processes()}
        assert not long_exec.done()  # all of it happened during the exec
        assert (await long_exec).stdout == "done\n"


async def test_past_the_running_cap_spawn_is_a_clear_error(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        sleepers = [await session.spawn(["sleep", "120"]) for _ in range(PROC["PROC_MAX"])]
        with pytest.raises(ProcessError, match="refused"):
            await session.spawn(["true"])
        for proc in sleepers:
            await proc.kill(signal.SIGKILL)
        assert {await p.wait(timeout=60) for p in sleepers} == {128 + signal.SIGKILL}
        # Room again, and the session unharmed.
        assert await (await session.spawn(["true"])).wait(timeout=30) == 0
        assert (await session.exec("echo ok")).stdout == "ok\n"


async def test_reads_given_up_by_the_caller_do_not_fail_a_write(scheduler: Scheduler) -> None:
    """A read the caller cancels (asyncio.wait_for around a quiet stream) stays held in the guest
    until its 30 s pass: there is no cancel frame. Past PROC_PENDING_MAX of them the guest
    answers ERROR LIMIT; a write then waits for a slot as a read does, it does not fail."""
    async with await scheduler.session(language="raw") as session:
        cat = await session.spawn(["cat"])
        for _ in range(PROC["PROC_PENDING_MAX"] + 4):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(cat.stdout.__anext__(), 0.05)
        await asyncio.wait_for(cat.write_stdin(b"still heard\n"), 90)
        assert await read_until(cat.stdout, b"still heard\n", timeout=90)
        await cat.close_stdin()
        assert await cat.wait(timeout=60) == 0
