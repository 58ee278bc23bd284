"""What going through `sbx serve` adds to a call, against the same call in-process, in one run.

One process holds a local Scheduler (warm pool 1) and RemoteSchedulers (httpx) to an `sbx serve`
subprocess (warm pool 1) on its Unix socket and on TCP with a token, plus a minimal HTTP/1.1
client on the Unix socket (`Raw`, this bench only: one write per request, no client library)
as the floor of the HTTP exchange. Every path is called in a shuffled order per round, and
each call of a "quiet" series comes after the same idle gap on every path (`--gap`), so both
sides pay the same wake-up; "back to back" series have no gap.

1. GET /v1/info: the HTTP path alone (no VM).
2. session exec("pass"): the same VM work on every path, nothing refilling behind it;
   `wall - total` is the caller's time minus the Session's own timing.total_ms.
3. warm-pool hit run("print(1)"): each call after the local pool refilled and the gap (the
   server's pool refills in it: there is no API to wait on it). Only pool hits count. Also
   through a bare httpx client (httpx/unix): the HTTP library's share apart from the client's.
4. streaming (`--clients`): one session's process prints `time.time()` every 50 ms; N readers
   follow it, each through its own RemoteScheduler (a WebSocket each), against as many
   in-process readers. Latency: the reader's host time minus the guest's stamp, corrected by
   the guest clock's offset (five exec round trips; error: half a round trip, both sides).
   Then 50 concurrent WebSocket execs over 3 sessions: each output line's delay after the
   exec's first line, beyond the code's own gaps (guest perf_counter), against the same execs
   in-process with on_stdout.
5. `--idle-rounds N`: GET /v1/info 6 s after the client's previous call (an agent's pace), by a
   RemoteScheduler as shipped (its socket connection kept) against one given httpx's 5 s
   keep-alive of before (a new connection per call), interleaved.

    .venv/bin/python bench/server.py --runs 30 --clients 1,24,50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from common import percentile
from websockets.asyncio.client import unix_connect

from exec_sandbox import Scheduler, SchedulerConfig, wire
from exec_sandbox.models import ExecutionResult
from exec_sandbox.remote import RemoteScheduler
from exec_sandbox.remote import _connection as remote_connection

SBX = str(Path(sys.executable).with_name("sbx"))
BASE = "in-process"
PRINTER = (
    "import time\ntime.sleep({delay})\n"
    "for _ in range({lines}):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.05)"
)
EXEC_LINES = 10
EXEC_SESSIONS = 3  # the 50 concurrent execs share these (their execs queue per session)
EXEC_GAP_S = 0.05
EXEC_CODE = (
    "import time\nt0 = time.perf_counter()\n"
    f"for i in range({EXEC_LINES}):\n"
    "    print(f'{time.perf_counter() - t0:.6f}', flush=True)\n"
    f"    time.sleep({EXEC_GAP_S})\n"
)
Call = Callable[[], Awaitable[Any]]


def fmt(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 50):7.2f} ms  p95 {percentile(values, 95):7.2f} ms  "
        f"mean {statistics.fmean(values):7.2f} ms  (n={len(values)})"
    )


def report(times: dict[str, list[float]], base: str) -> None:
    b50, b95 = percentile(times[base], 50), percentile(times[base], 95)
    for name, values in times.items():
        line = f"  {name:13s} {fmt(values)}"
        if name != base:
            p50, p95 = percentile(values, 50), percentile(values, 95)
            ratio = f"{p50 / b50:.2f}x" if b50 > 0.1 else "no ratio: baseline ~0"
            line += f"  added p50 {p50 - b50:+.2f} ms ({ratio}), p95 {p95 - b95:+.2f}"
        print(line)


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class Raw:
    """HTTP/1.1 on the Unix socket, kept alive, each request written at once: the floor of
    the exchange (no client library). The answer is decoded as RemoteScheduler decodes it."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock

    async def start(self) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(str(self.sock))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        self.writer.write(request)
        status = await self.reader.readline()
        if not status:  # the server closed the idle connection: once more on a new one
            await self.close()
            await self.start()
            self.writer.write(request)
            status = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) != b"\r\n":
            if not line:
                raise ConnectionError("the server closed the connection mid-answer")
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answer = await self.reader.readexactly(length)
        assert status.split()[1] == b"200", (status, answer[:200])
        return json.loads(answer)


@contextlib.contextmanager
def served(root: Path) -> Iterator[tuple[Path, str, str]]:
    """`sbx serve` on a socket and a port with a warm pool of one: (socket, url, token)."""
    env = {**os.environ, "EXEC_SANDBOX_STATE_DIR": str(root / "state")}
    token = subprocess.run(
        [SBX, "token", "create", "--name", "bench"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    token = next(w for w in token.split() if w.startswith("sbx_"))
    sock = root / "sbx.sock"
    argv = [SBX, "serve", "--socket", str(sock), "--port", "0", "--warm-pool", "1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        out = b""
        while b"http://" not in out:
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            if not ready or proc.poll() is not None:
                raise RuntimeError("sbx serve did not start")
            out += os.read(proc.stdout.fileno(), 4096)
        url = "http://" + out.decode().split("http://", 1)[1].split()[0]
        yield sock, url, token
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


async def series(
    calls: dict[str, Call], rounds: int, gap: float, before: Call | None = None
) -> dict[str, tuple[list[float], list[Any]]]:
    """Each call once per round in a shuffled order (no path always follows another), each
    after `before` and `gap` seconds of quiet: (ms, result) per path."""
    out: dict[str, tuple[list[float], list[Any]]] = {name: ([], []) for name in calls}
    order = list(calls.items())
    for _ in range(rounds):
        random.shuffle(order)
        for name, call in order:
            if before is not None:
                await before()
            if gap:
                await asyncio.sleep(gap)
            started = time.perf_counter()
            result = await call()
            out[name][0].append((time.perf_counter() - started) * 1000)
            out[name][1].append(result)
    return out


async def http_round_trips(
    remotes: dict[str, RemoteScheduler], raw: Raw, runs: int, gap: float
) -> None:
    calls: dict[str, Call] = {name: r.info for name, r in remotes.items()}
    calls["raw/unix"] = lambda: raw.call("GET", "/v1/info")
    for call in calls.values():
        await call()
    for label, rounds, wait in (("back to back", runs * 10, 0.0), (f"after {gap} s", runs, gap)):
        got = series(calls, rounds, wait)
        times = {name: ms for name, (ms, _) in (await got).items()}
        print(f"GET /v1/info (no VM), {label}, {load()}:")
        report(times, "raw/unix")


async def session_execs(
    local: Scheduler, remotes: dict[str, RemoteScheduler], raw: Raw, runs: int, gap: float
) -> None:
    sessions: dict[str, Any] = {BASE: await local.session()}
    for name, remote in remotes.items():
        sessions[name] = await remote.session()
    raw_session = await remotes["server/unix"].session()
    raw_path = f"/v1/sessions/{raw_session.session_id}/exec"

    async def raw_exec() -> ExecutionResult:
        return wire.decode(ExecutionResult, await raw.call("POST", raw_path, {"code": "pass"}))

    calls: dict[str, Call] = {name: (lambda s=s: s.exec("pass")) for name, s in sessions.items()}
    calls["raw/unix"] = raw_exec
    try:
        for call in calls.values():
            await call()
        for label, rounds, wait in (("back to back", runs * 5, 0.0), (f"after {gap} s", runs, gap)):
            got = await series(calls, rounds, wait)
            times = {name: ms for name, (ms, _) in got.items()}
            print(f"session exec('pass'), {label}, {load()}:")
            report(times, BASE)
            gaps = {
                name: [m - r.timing.total_ms for m, r in zip(ms, rs, strict=True)]
                for name, (ms, rs) in got.items()
            }
            print(
                "  wall - total_ms p50: "
                + ", ".join(f"{name} {percentile(v, 50):.2f}" for name, v in gaps.items())
            )
    finally:
        for session in [*sessions.values(), raw_session]:
            await session.close()


async def pool_hits(
    local: Scheduler, remotes: dict[str, RemoteScheduler], raw: Raw, runs: int, gap: float
) -> None:
    async def raw_run() -> ExecutionResult:
        return wire.decode(ExecutionResult, await raw.call("POST", "/v1/run", {"code": "print(1)"}))

    # The same request by a bare httpx client on the socket: RemoteScheduler's own code
    # (validation, options, the checked read) apart from the HTTP library's.
    bare = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(raw.sock)), base_url="http://localhost"
    )

    async def httpx_run() -> ExecutionResult:
        answer = await bare.post("/v1/run", json={"code": "print(1)"})
        return wire.decode(ExecutionResult, answer.raise_for_status().json())

    calls: dict[str, Call] = {BASE: lambda: local.run("print(1)")}
    calls.update({name: (lambda r=r: r.run("print(1)")) for name, r in remotes.items()})
    calls["httpx/unix"] = httpx_run
    calls["raw/unix"] = raw_run
    for call in calls.values():  # warm every path once (connections, imports)
        await call()
        await local.wait_pool_ready(60)
        await asyncio.sleep(gap)

    async def refilled() -> None:
        await local.wait_pool_ready(60)

    try:
        got = await series(calls, runs, gap, before=refilled)
    finally:
        await bare.aclose()
    times = {
        name: [m for m, r in zip(ms, rs, strict=True) if r.warm_pool_hit]
        for name, (ms, rs) in got.items()
    }
    misses = sum(len(ms) - len(times[name]) for name, (ms, _) in got.items())
    print(f"warm-pool hit run('print(1)'), {runs} rounds, {misses} misses left out, {load()}:")
    report(times, BASE)
    # The caller's time minus the time run() measured itself (in the server for the remote
    # paths): what the path adds around the same Scheduler call, without the VM's own noise.
    outside = {
        name: [m - r.timing.total_ms for m, r in zip(ms, rs, strict=True) if r.warm_pool_hit]
        for name, (ms, rs) in got.items()
    }
    print(
        "  wall - total_ms p50: "
        + ", ".join(f"{name} {percentile(v, 50):.2f}" for name, v in outside.items())
    )


async def clock_offset(session: Any) -> float:
    """Guest time - host time, seconds (the middle of an exec round trip)."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        before = time.time()
        result = await session.exec("import time; print(repr(time.time()))")
        after = time.time()
        guest = float(result.stdout)
        if best is None or after - before < best[0]:
            best = (after - before, guest - (before + after) / 2)
    assert best is not None
    return best[1]


async def follow(reader: AsyncIterator[bytes], offset: float, out: list[float]) -> None:
    buffer = b""
    async for chunk in reader:
        now = time.time()
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            out.append((now - (float(line) - offset)) * 1000)


async def fan_out(session: Any, readers: list[Any], lines: int) -> list[float]:
    """Latencies of every line to every reader, readers attached before the first print."""
    offset = await clock_offset(session)
    latencies: list[float] = []
    process = await session.spawn(["python3", "-c", PRINTER.format(delay=3, lines=lines)])
    tasks = [asyncio.ensure_future(follow(r(process), offset, latencies)) for r in readers]
    assert await process.wait() == 0
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return latencies


async def readers_of_one_process(local: Scheduler, sock: Path, clients: int, lines: int) -> None:
    async with await local.session() as session:
        in_process = await fan_out(session, [lambda p: p.stdout] * clients, lines)
    async with RemoteScheduler(sock) as owner, await owner.session() as shared:
        remotes = [RemoteScheduler(sock) for _ in range(clients)]
        try:
            attached = [await r.attach(shared.session_id) for r in remotes]

            def reader(i: int) -> Any:
                async def chunks(process: Any) -> AsyncIterator[bytes]:
                    for p in await attached[i].processes():
                        if p.pid == process.pid:
                            async for chunk in p.stdout:
                                yield chunk

                return chunks

            through = await fan_out(shared, [reader(i) for i in range(clients)], lines)
        finally:
            for r in remotes:
                await r.close()
    print(f"{clients} concurrent readers of one process's output, {lines} lines each, {load()}:")
    report({BASE: in_process, "server/unix": through}, BASE)


def line_delays(arrivals: list[tuple[float, float]]) -> list[float]:
    """(host arrival, guest time) of each line -> ms each line came later than the code's own
    gap after the first line."""
    host0, guest0 = arrivals[0]
    return [((h - host0) - (g - guest0)) * 1000 for h, g in arrivals[1:]]


async def concurrent_execs(local: Scheduler, remote: RemoteScheduler, sock: Path) -> None:
    opened = [await remote.session() for _ in range(EXEC_SESSIONS)]

    async def remote_one(i: int) -> list[float]:
        arrivals: list[tuple[float, float]] = []
        url = f"ws://sbx/v1/sessions/{opened[i % EXEC_SESSIONS].session_id}/exec"
        async with unix_connect(str(sock), url) as ws:
            await ws.send(json.dumps({"code": EXEC_CODE}))
            pending = ""
            async for raw in ws:
                message = json.loads(raw)
                if message["type"] != "stdout":
                    break
                now = time.perf_counter()
                pending += message["data"]
                while "\n" in pending:
                    line, pending = pending.split("\n", 1)
                    arrivals.append((now, float(line)))
        return line_delays(arrivals)

    remote_delays = [d for ds in await asyncio.gather(*map(remote_one, range(50))) for d in ds]
    for session in opened:
        await session.close()
    sessions = [await local.session() for _ in range(EXEC_SESSIONS)]

    async def local_one(i: int) -> list[float]:
        arrivals: list[tuple[float, float]] = []
        pending = [""]

        def on_stdout(text: str) -> None:
            now = time.perf_counter()
            pending[0] += text
            while "\n" in pending[0]:
                line, pending[0] = pending[0].split("\n", 1)
                arrivals.append((now, float(line)))

        await sessions[i % EXEC_SESSIONS].exec(EXEC_CODE, on_stdout=on_stdout)
        return line_delays(arrivals)

    local_delays = [d for ds in await asyncio.gather(*map(local_one, range(50))) for d in ds]
    for session in sessions:
        await session.close()
    print(f"50 concurrent WebSocket execs over {EXEC_SESSIONS} sessions, line delay, {load()}:")
    report({BASE: local_delays, "server/unix": remote_delays}, BASE)
    print(f"  all 50 answered: {len(remote_delays) == 50 * (EXEC_LINES - 1)}")


async def idle_connections(sock: Path, rounds: int) -> None:
    kept = RemoteScheduler(sock)
    await kept.start()
    shipped = remote_connection._SOCKET_KEEP_ALIVE_SECONDS
    remote_connection._SOCKET_KEEP_ALIVE_SECONDS = 5.0  # read when the connection is made
    try:
        dropped = RemoteScheduler(sock)
        await dropped.start()
    finally:
        remote_connection._SOCKET_KEEP_ALIVE_SECONDS = shipped
    try:
        calls: dict[str, Call] = {"kept": kept.info, "5 s keep-alive": dropped.info}
        got = await series(calls, rounds, 6.0)
        print(f"GET /v1/info 6 s after the previous call, {load()}:")
        report({name: ms for name, (ms, _) in got.items()}, "5 s keep-alive")
    finally:
        await kept.close()
        await dropped.close()


async def main(args: argparse.Namespace) -> None:
    fans = [int(n) for n in args.clients.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="sbx-bench-") as tmp, served(Path(tmp)) as server:
        sock, url, token = server
        config = SchedulerConfig(warm_pool_size=1, max_concurrent_vms=8)
        raw = Raw(sock)
        await raw.start()
        async with (
            Scheduler(config) as local,
            RemoteScheduler(sock) as unix,
            RemoteScheduler(url, token) as tcp,
        ):
            await local.wait_pool_ready(120)
            remotes = {"server/unix": unix, "server/tcp": tcp}
            print(f"start: {load()}")
            if args.runs:
                await http_round_trips(remotes, raw, args.runs, args.gap)
                await session_execs(local, remotes, raw, args.runs, args.gap)
                await pool_hits(local, remotes, raw, args.runs, args.gap)
            for fan in fans:
                await readers_of_one_process(local, sock, fan, args.lines)
            if fans:
                await concurrent_execs(local, unix, sock)
            if args.idle_rounds:
                await idle_connections(sock, args.idle_rounds)
        await raw.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="rounds; 0: streaming only")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds of quiet before a call")
    parser.add_argument("--clients", default="1,50", help="fan-outs, comma-separated ('' none)")
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--idle-rounds", type=int, default=0, help="rounds of part 5 (12 s each)")
    asyncio.run(main(parser.parse_args()))
