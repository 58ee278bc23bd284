"""What going through `sbx serve` adds, against the same calls in-process, interleaved in one run:

* a warm-pool hit `run("print(1)")`: a local Scheduler (warm_pool_size=1) against
  RemoteScheduler on the server's Unix socket and on TCP with a token (the server also with
  --warm-pool 1). Only calls that were pool hits count; each round waits for both pools to
  refill first, so neither call pays for the other's refill.
* GET /v1/info on both listeners: the HTTP path alone, no VM; and `session.exec("pass")` in a
  session of each path (the same VM work, nothing refilling behind it).
* 1 and 50 concurrent streaming clients: one session's process prints a time stamp every 50 ms;
  the readers follow its output, each through its own RemoteScheduler connection (a WebSocket
  each), against as many in-process readers of the same program in a local session. Latency is the
  host's time at the reader minus the guest's time stamp, corrected by the guest clock's offset
  (measured by an exec round trip in each VM; its error is half that round trip, ~2 ms).

    .venv/bin/python bench/server_roundtrip.py --runs 40 --clients 1,20,50

(`--runs 0`: the streaming part only.) Past 24 clients the server's readers (two guest reads
held per attached client: stdout and stderr) exceed the 48 the host holds at once per VM
(processes.HELD_MAX), and the rest poll every 0.2 s: the p95 shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.remote import RemoteScheduler

SBX = str(Path(sys.executable).with_name("sbx"))
PRINTER = (
    "import time\ntime.sleep({delay})\n"
    "for _ in range({lines}):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.05)"
)


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


async def info_round_trips(remotes: dict[str, RemoteScheduler], runs: int) -> None:
    """GET /v1/info: the HTTP path alone (no VM), per listener."""
    times: dict[str, list[float]] = {name: [] for name in remotes}
    for _ in range(runs):
        for name, remote in remotes.items():
            started = time.perf_counter()
            await remote.info()
            times[name].append((time.perf_counter() - started) * 1000)
    print("GET /v1/info (no VM):")
    for name, values in times.items():
        print(f"  {name:12s} {summary(values)}")


async def pool_hits(
    local: Scheduler, remotes: dict[str, RemoteScheduler], runs: int, settle: float
) -> None:
    times: dict[str, list[float]] = {"in-process": [], **{name: [] for name in remotes}}
    calls: dict[str, Any] = {"in-process": local, **remotes}
    for scheduler in calls.values():  # warm every path once (connections, imports)
        await scheduler.run("print(1)")
    misses = 0
    order = list(calls.items())
    for _ in range(runs):
        random.shuffle(order)  # no path always follows another's refill
        for name, scheduler in order:
            await local.wait_pool_ready(60)
            await asyncio.sleep(settle)  # the server's pool refills too (no API to wait on it)
            started = time.perf_counter()
            result = await scheduler.run("print(1)")
            ms = (time.perf_counter() - started) * 1000
            if result.warm_pool_hit:
                times[name].append(ms)
            else:
                misses += 1
    base = percentile(times["in-process"], 50)
    base95 = percentile(times["in-process"], 95)
    print(f"pool-hit run('print(1)'), {runs} rounds ({misses} misses left out):")
    for name, values in times.items():
        print(f"  {name:12s} {summary(values)}")
        if name != "in-process":
            p50, p95 = percentile(values, 50), percentile(values, 95)
            print(
                f"  {'':12s} added p50 {p50 - base:+.2f} ms (ratio {p50 / base:.2f}x), "
                f"p95 {p95 - base95:+.2f} ms"
            )


async def session_execs(local: Scheduler, remotes: dict[str, RemoteScheduler], runs: int) -> None:
    """exec("pass") in a session of each path, interleaved: what the server adds to a call
    whose VM work is the same (no pool refill behind it). `wall - total`: the call's time at
    the caller minus the time Session.exec measured itself (in the server, for remote calls)."""
    sessions: dict[str, Any] = {"in-process": await local.session()}
    for name, remote in remotes.items():
        sessions[name] = await remote.session()
    wall: dict[str, list[float]] = {name: [] for name in sessions}
    extra: dict[str, list[float]] = {name: [] for name in sessions}
    try:
        for session in sessions.values():
            await session.exec("pass")
        for _ in range(runs):
            for name, session in sessions.items():
                started = time.perf_counter()
                result = await session.exec("pass")
                wall[name].append((time.perf_counter() - started) * 1000)
                extra[name].append(wall[name][-1] - result.timing.total_ms)
    finally:
        for session in sessions.values():
            await session.close()
    base = percentile(wall["in-process"], 50)
    print(f"session exec('pass'), {runs} rounds:")
    for name in sessions:
        p50 = percentile(wall[name], 50)
        print(
            f"  {name:12s} {summary(wall[name])}  wall - total p50 "
            f"{percentile(extra[name], 50):.2f} ms"
        )
        if name != "in-process":
            print(f"  {'':12s} added p50 {p50 - base:+.2f} ms (ratio {p50 / base:.2f}x)")


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


async def fan_out(session: Any, readers: list[AsyncIterator[bytes]], lines: int) -> list[float]:
    """Latencies of every line to every reader, readers attached before the first print."""
    offset = await clock_offset(session)
    latencies: list[float] = []
    process = await session.spawn(["python3", "-c", PRINTER.format(delay=3, lines=lines)])
    tasks = [asyncio.ensure_future(follow(r(process), offset, latencies)) for r in readers]
    assert await process.wait() == 0
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return latencies


async def streaming(local: Scheduler, sock: Path, clients: int, lines: int) -> None:
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
    print(f"{clients} concurrent readers of one process's output, {lines} lines each:")
    print(f"  in-process   {summary(in_process)}")
    print(f"  server/unix  {summary(through)}")
    p95, base95 = percentile(through, 95), percentile(in_process, 95)
    print(f"  p95 added {p95 - base95:+.1f} ms (ratio {p95 / max(base95, 0.1):.2f}x)")


async def main(runs: int, fans: list[int], lines: int, settle: float) -> None:
    with tempfile.TemporaryDirectory(prefix="sbx-bench-") as tmp, served(Path(tmp)) as server:
        sock, url, token = server
        config = SchedulerConfig(warm_pool_size=1, max_concurrent_vms=4)
        async with (
            Scheduler(config) as local,
            RemoteScheduler(sock) as unix,
            RemoteScheduler(url, token) as tcp,
        ):
            await local.wait_pool_ready(120)
            remotes = {"server/unix": unix, "server/tcp": tcp}
            if runs:
                await info_round_trips(remotes, 200)
                await session_execs(local, remotes, runs * 5)
                await pool_hits(local, remotes, runs, settle)
            for fan in fans:
                await streaming(local, sock, fan, lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--clients", default="1,50", help="the fan-outs to measure, comma-separated"
    )
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between calls")
    args = parser.parse_args()
    fans = [int(n) for n in args.clients.split(",")]
    asyncio.run(main(args.runs, fans, args.lines, args.settle))
