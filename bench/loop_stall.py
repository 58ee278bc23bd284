"""How long exec_sandbox holds the asyncio loop: a 1 ms ticker runs on the loop while 8 `run()`
calls start, run and close their VMs concurrently, and records how late each tick comes.

A late tick has two causes on a busy 2-core host: code on the loop thread (ours, or the GIL held
by one of our threads), and the kernel not giving the loop thread a CPU at all (8 emulated guests
compete for 2 cores). The second is read from /proc/thread-self/schedstat (time spent waiting on a
run queue) and subtracted: "held" is the stall exec_sandbox caused, "raw" what the ticker saw.
Every loop callback that held the loop longer than --report-ms is listed with what it ran.

    .venv/bin/python bench/loop_stall.py --vms 8 --rounds 3            # cold boots
    .venv/bin/python bench/loop_stall.py --vms 8 --rounds 3 --l1       # L1 snapshot clones
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import percentile

from exec_sandbox import Scheduler, SchedulerConfig
from tests.loop_meter import CallbackMeter, RunQueueClock

TICK_SECONDS = 0.001


def steal_seconds() -> float:
    """CPU time the hypervisor took from this (virtual) machine so far, all CPUs."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


class GcMeter:
    """Durations of Python's garbage collections (on whatever thread ran them)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int]] = []  # (seconds, generation)
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._started, info["generation"]))


async def ticker(
    clock: RunQueueClock, stop: asyncio.Event, out: list[tuple[float, float, float]]
) -> None:
    """Sleep 1 ms at a time; record (raw lateness, lateness minus run-queue wait, start) per
    tick."""
    while not stop.is_set():
        w0, q0 = time.perf_counter(), clock.waited_s()
        await asyncio.sleep(TICK_SECONDS)
        late = time.perf_counter() - w0 - TICK_SECONDS
        out.append((late, late - (clock.waited_s() - q0), w0))


async def workload(scheduler: Scheduler, vms: int, rounds: int, l1: bool) -> None:
    for _ in range(rounds):
        results = await asyncio.gather(*(scheduler.run("print(1)") for _ in range(vms)))
        for result in results:
            assert result.exit_code == 0 and result.stdout == "1\n", result
            assert result.l1_cache_hit == l1, result
        # Let the retired VMs go (close runs after run() returns) inside the measurement.
        await asyncio.sleep(0.3)


async def main(clock: RunQueueClock, vms: int, rounds: int, l1: bool, report_ms: float) -> None:
    with tempfile.TemporaryDirectory(prefix="sbx-stall-") as cache:
        config = SchedulerConfig(
            max_concurrent_vms=vms,
            cpu_overcommit_ratio=float(vms),
            memory_snapshots=l1,
            memory_snapshot_cache_dir=Path(cache),
            warm_pool_size=0,
        )
        async with Scheduler(config) as scheduler:
            if l1:
                assert await scheduler.prepare_snapshot("python")
            await scheduler.run("print(1)")  # first VM of the process: not measured
            meter = CallbackMeter(clock, report_ms / 1000)
            ticks: list[tuple[float, float, float]] = []
            stop = asyncio.Event()
            meter.install()
            gc_meter = GcMeter()
            gc.callbacks.append(gc_meter)
            tick_task = asyncio.create_task(ticker(clock, stop, ticks))
            steal_before = steal_seconds()
            started = time.perf_counter()
            try:
                await workload(scheduler, vms, rounds, l1)
            finally:
                stop.set()
                await tick_task
                meter.uninstall()
                gc.callbacks.remove(gc_meter)
            elapsed = time.perf_counter() - started
            steal = steal_seconds() - steal_before

    raw = [t[0] * 1000 for t in ticks]
    held = [t[1] * 1000 for t in ticks]
    path = "L1 clones" if l1 else "cold boots"
    print(
        f"{rounds} rounds of {vms} concurrent run() ({path}), {elapsed:.1f} s, "
        f"{len(ticks)} ticks of {TICK_SECONDS * 1000:.0f} ms; CPU stolen by the hypervisor: "
        f"{steal * 1000:.0f} ms"
    )
    print(
        f"  tick lateness, raw:  max {max(raw):7.1f} ms  p99 {percentile(raw, 99):6.1f} ms  "
        f"p50 {percentile(raw, 50):5.2f} ms"
    )
    print(
        f"  loop held (raw minus run-queue wait):  max {max(held):7.1f} ms  "
        f"p99 {percentile(held, 99):6.1f} ms  ticks held > 5 ms: {sum(h > 5 for h in held)}"
    )
    print(f"  callbacks that held the loop > {report_ms:g} ms: {len(meter.slow)}")
    print(
        "    held = wall - run-queue wait; cpu = the loop thread's own CPU time in it (the rest"
        " of held: blocked in a syscall, or the host's hypervisor took the CPU: steal)"
    )
    for stall in sorted(meter.slow, key=lambda s: s.held_s, reverse=True)[:16]:
        print(f"    {stall}")
    longest_gc = max(gc_meter.pauses, default=(0.0, 0))
    print(
        f"  garbage collections: {len(gc_meter.pauses)}, longest {longest_gc[0] * 1000:.1f} ms "
        f"(generation {longest_gc[1]})"
    )
    # Ticks held long without a callback that held it: the time went between callbacks (the
    # selector, or the GIL taken back from another thread of the process).
    worst = sorted(ticks, reverse=True, key=lambda t: t[1])[:5]
    print("  worst ticks: held; of which in callbacks (how many, the longest)")
    for _late, held_s, start in worst:
        end = start + TICK_SECONDS + _late
        spans = [(h, what) for s0, s1, h, what in meter.spans if s0 < end and s1 > start]
        inside = [h for h, _what in spans]
        kinds = sorted({what for h, what in spans if what})
        print(
            f"    {held_s * 1000:7.1f} ms; {sum(inside) * 1000:7.1f} ms ({len(inside)}, "
            f"{max(inside, default=0) * 1000:.1f} ms){': ' if kinds else ''}{', '.join(kinds)}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vms", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--l1", action="store_true", help="clones of a memory snapshot")
    parser.add_argument("--report-ms", type=float, default=2.0)
    args = parser.parse_args()
    # The loop thread's clock, opened on that thread, closed once the loop is gone.
    run_queue = RunQueueClock()
    try:
        asyncio.run(main(run_queue, args.vms, args.rounds, args.l1, args.report_ms))
    finally:
        run_queue.close()
