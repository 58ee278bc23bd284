"""The relay and the agent beside CPU-bound user code, in one run on this machine.

User code runs SCHED_BATCH, the agent SCHED_OTHER (guest/src/spawn.c). A SCHED_BATCH wake-up
never preempts the running task: were the agent SCHED_BATCH too, then while user code spins the
agent (woken by the host's frames or a client's bytes) would wait for the scheduler tick (the
guest kernel has HZ=100: up to 10 ms) instead of running at once. This bench puts a number on
it: in one session, alternately alone and beside a process that only spins,

- a download and an upload through the relay (guest client <-> host loopback server),
- the round trip of an empty `session.exec` (the agent's wake-up and the REPL's),

and prints each median and the ratio beside / alone. To compare with an agent that is
SCHED_BATCH too, build an image whose agent sets it for itself at boot and run this again.

    .venv/bin/python bench/net_beside_cpu.py --mb 16 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from network import TRANSFERS, VM_MEMORY_MB, start_servers

from exec_sandbox import Scheduler, SchedulerConfig

SPIN_START = (
    "import subprocess, sys\n"
    "SPINNER = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
)
SPIN_STOP = "SPINNER.kill(); SPINNER.wait()\n"
EXECS_PER_ROUND = 10


async def one_round(session, ports: list[int], total: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Every measure alone, then beside the spinner."""
    row: dict[str, float] = {}
    for beside in (False, True):
        if beside:
            assert (await session.exec(SPIN_START)).exit_code == 0
        suffix = "_beside" if beside else "_alone"
        for way, body in (
            ("down", f"print(download(HOST, {ports[1]})[1])\n"),
            ("up", f"print(upload(HOST, {ports[2]}, {total})[1])\n"),
        ):
            done = await session.exec("HOST = 'bench.test'\n" + TRANSFERS + body)
            assert done.exit_code == 0, done.stderr
            row[way + suffix] = float(done.stdout)
        times = []
        for _ in range(EXECS_PER_ROUND):
            at = time.monotonic()
            assert (await session.exec("pass")).exit_code == 0
            times.append((time.monotonic() - at) * 1000)
        row["exec_ms" + suffix] = statistics.median(times)
        if beside:
            assert (await session.exec(SPIN_STOP)).exit_code == 0
    return row


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=16, help="MB each way per transfer")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    total = args.mb << 20
    proc, ports = start_servers(total)
    hosts = {f"bench.test:{p}": f"127.0.0.1:{p}" for p in ports}
    rows = []
    try:
        with tempfile.TemporaryDirectory() as cache:
            config = SchedulerConfig(
                max_concurrent_vms=1,
                memory_snapshot_cache_dir=Path(cache),
                network_test_hosts=hosts,
            )
            async with Scheduler(config) as sched:
                session = await sched.session(
                    allow_network=True,
                    timeout_seconds=300,
                    memory_mb=VM_MEMORY_MB,
                    allowed_domains=[f"bench.test:{p}" for p in ports],
                )
                async with session:
                    await one_round(session, ports, total)  # unmeasured: TCG translates first
                    for r in range(args.rounds):
                        rows.append(await one_round(session, ports, total))
                        print(f"round {r + 1}: {json.dumps(rows[-1])}", file=sys.stderr)
    finally:
        proc.kill()
    print(f"{'':10} {'alone':>8} {'beside':>8} {'beside / alone':>15}")
    for key, unit in (("down", "MB/s"), ("up", "MB/s"), ("exec_ms", "ms")):
        alone = statistics.median(r[key + "_alone"] for r in rows)
        beside = statistics.median(r[key + "_beside"] for r in rows)
        ratio = statistics.median(r[key + "_beside"] / r[key + "_alone"] for r in rows)
        print(f"{key + ' ' + unit:10} {alone:8.2f} {beside:8.2f} {ratio:15.2f}")


if __name__ == "__main__":
    asyncio.run(main())
