"""`sbx serve` against the same calls in-process, in one run on this machine:

1. the HTTP round trip alone (`GET /v1/health` on the Unix socket): what the server adds to
   any call, back to back and after 1.5 s of quiet (as the runs of 2. come);
2. a warm-pool-hit `run("print(1)")` through the server (Unix socket) against the same call
   on an in-process Scheduler of the same config, interleaved so both see the same load (the
   target: under 2 ms added at p50);
3. 50 concurrent streaming clients (WebSocket execs spread over 3 sessions): the delay of
   each output line after the exec's first one, beyond the delay the code put between them
   (guest perf_counter), against the same execs in-process with on_stdout callbacks. Guest and
   host clocks differ by milliseconds, so only delays within one exec are compared.

    .venv/bin/python bench/server.py --runs 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from common import percentile, summary
from websockets.asyncio.client import unix_connect

from exec_sandbox import Scheduler, SchedulerConfig

LINES = 10
# Sessions the 50 clients share (their execs queue per session): what 2 cores hold at once.
SESSIONS = 3
GAP_S = 0.05
# Each line: its guest time since the first line, so the client can tell the code's own gaps
# from the delays of the path.
STREAM_CODE = (
    "import time\nt0 = time.perf_counter()\n"
    f"for i in range({LINES}):\n"
    "    print(f'{time.perf_counter() - t0:.6f}', flush=True)\n"
    f"    time.sleep({GAP_S})\n"
)


def start_server(tmp: Path, warm_pool: int) -> tuple[subprocess.Popen[bytes], Path]:
    sock = tmp / "sbx.sock"
    env = {**os.environ, "EXEC_SANDBOX_STATE_DIR": str(tmp / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "exec_sandbox.cli", "serve", "--socket", str(sock)]
        + ["--warm-pool", str(warm_pool), "--max-vms", "8"],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready and b"listening" in os.read(proc.stdout.fileno(), 4096), "server did not start"
    return proc, sock


async def round_trips(client: httpx.AsyncClient, runs: int) -> None:
    print("== 1. HTTP round trip on the Unix socket (GET /v1/health) ==")
    times = []
    for _ in range(runs * 5):
        t = time.perf_counter()
        (await client.get("/health")).raise_for_status()
        times.append((time.perf_counter() - t) * 1000)
    print(f"  back to back      {summary(times)}")
    # The pool-hit runs below come after 1.5 s of quiet (the pools refill): an idle client
    # and server wake up for them, which a call in one process does not pay.
    idle = []
    for _ in range(runs):
        await asyncio.sleep(1.5)
        t = time.perf_counter()
        (await client.get("/health")).raise_for_status()
        idle.append((time.perf_counter() - t) * 1000)
    print(f"  after 1.5 s idle  {summary(idle)}")


async def pool_hits(client: httpx.AsyncClient, sched: Scheduler, runs: int) -> None:
    print("\n== 2. warm-pool-hit run('print(1)'): in-process vs through the server ==")
    local: list[float] = []
    remote: list[float] = []
    hits = {"in-process": 0, "server": 0}
    # run()'s own total_ms: what of the difference is inside the Scheduler, what around it.
    inside: dict[str, list[float]] = {"in-process": [], "server": []}
    for _ in range(runs):
        # In a random order each round (a fixed one measured an order effect of ~1 ms), each
        # call after both pools refilled, so every call is a hit.
        for where in random.sample(["in-process", "server"], 2):
            await sched.wait_pool_ready(60)
            await asyncio.sleep(1.5)
            t = time.perf_counter()
            if where == "in-process":
                result = await sched.run("print(1)")
                local.append((time.perf_counter() - t) * 1000)
                hit = result.warm_pool_hit
                inside["in-process"].append(result.timing.total_ms)
            else:
                answer = (await client.post("/run", json={"code": "print(1)"})).json()
                remote.append((time.perf_counter() - t) * 1000)
                hit = answer["warm_pool_hit"]
                inside["server"].append(answer["timing"]["total_ms"])
            hits[where] += hit
    print(f"  in-process {summary(local)}  pool hits {hits['in-process']}/{runs}")
    print(f"  server     {summary(remote)}  pool hits {hits['server']}/{runs}")
    print(
        f"  run()'s own total_ms p50: in-process {percentile(inside['in-process'], 50):.0f}, "
        f"in the server {percentile(inside['server'], 50):.0f}"
    )
    added = percentile(remote, 50) - percentile(local, 50)
    print(f"  added by the server at p50: {added:.1f} ms (target < 2 ms)")


def line_delays(arrivals: list[tuple[float, float]]) -> list[float]:
    """(host arrival, guest time) of each line -> ms each line came later than the code's own
    gap after the first line."""
    host0, guest0 = arrivals[0]
    return [((h - host0) - (g - guest0)) * 1000 for h, g in arrivals[1:]]


async def streaming(sock: Path, client: httpx.AsyncClient, sched: Scheduler) -> None:
    print(f"\n== 3. 50 concurrent streaming clients (execs over {SESSIONS} sessions) ==")
    opened = [(await client.post("/sessions", json={})).json() for _ in range(SESSIONS)]
    assert all("id" in o for o in opened), opened
    sids = [o["id"] for o in opened]

    async def remote_one(i: int) -> list[float]:
        arrivals: list[tuple[float, float]] = []
        url = f"ws://sbx/v1/sessions/{sids[i % SESSIONS]}/exec"
        async with unix_connect(str(sock), url) as ws:
            await ws.send(json.dumps({"code": STREAM_CODE}))
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

    started = time.perf_counter()
    remote = [d for ds in await asyncio.gather(*(remote_one(i) for i in range(50))) for d in ds]
    remote_wall = time.perf_counter() - started
    for sid in sids:
        await client.delete(f"/sessions/{sid}")

    sessions = [await sched.session() for _ in range(SESSIONS)]

    async def local_one(i: int) -> list[float]:
        arrivals: list[tuple[float, float]] = []
        pending = [""]

        def on_stdout(text: str) -> None:
            now = time.perf_counter()
            pending[0] += text
            while "\n" in pending[0]:
                line, pending[0] = pending[0].split("\n", 1)
                arrivals.append((now, float(line)))

        await sessions[i % SESSIONS].exec(STREAM_CODE, on_stdout=on_stdout)
        return line_delays(arrivals)

    started = time.perf_counter()
    local = [d for ds in await asyncio.gather(*(local_one(i) for i in range(50))) for d in ds]
    local_wall = time.perf_counter() - started
    for session in sessions:
        await session.close()
    print(f"  in-process line delay {summary(local)}  wall {local_wall:.1f} s")
    print(f"  server     line delay {summary(remote)}  wall {remote_wall:.1f} s")
    print(
        f"  p95 added by the server: {percentile(remote, 95) - percentile(local, 95):.1f} ms "
        f"(50 clients answered: {len(remote) == 50 * (LINES - 1)})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        proc, sock = start_server(Path(tmp), warm_pool=1)
        try:
            transport = httpx.AsyncHTTPTransport(uds=str(sock))
            async with (
                httpx.AsyncClient(
                    transport=transport, base_url="http://sbx/v1", timeout=300
                ) as client,
                Scheduler(SchedulerConfig(warm_pool_size=1, max_concurrent_vms=8)) as sched,
            ):
                await round_trips(client, args.runs)
                await pool_hits(client, sched, args.runs)
                await streaming(sock, client, sched)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)


if __name__ == "__main__":
    asyncio.run(main())
