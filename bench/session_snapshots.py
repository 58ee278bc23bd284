"""Paused, resumed and forked sessions, all in one run on this machine:

1. a python session holding 50 MB of data: pause, resume and fork(1) times, against opening a
   session (L1 restore, and cold boot) in the same run;
2. host memory (PSS of the QEMU processes) of 1, 5 and 10 forks of that session against as many
   independent sessions holding the same data.

    .venv/bin/python bench/session_snapshots.py --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.session import Session

DATA = "blob = bytearray(50 * 1024 * 1024)\nfor i in range(0, len(blob), 4096): blob[i] = i % 251\n"


def config(root: Path, **overrides: Any) -> SchedulerConfig:
    values: dict[str, Any] = {
        "memory_snapshot_cache_dir": root,
        "max_concurrent_vms": 12,
        "cpu_overcommit_ratio": 8.0,
    }
    values.update(overrides)
    return SchedulerConfig(**values)


def pss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


class StepLog(logging.Handler):
    """Collects the fork's per-step durations (session_snapshots.StepTimer logs them)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.steps: dict[str, list[float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " steps: " not in message:
            return
        for name, value in re.findall(r"([^;]+?) (\d+) ms", message.split(" steps: ", 1)[1]):
            self.steps.setdefault(name.strip(), []).append(float(value))

    def report(self) -> None:
        for name, values in self.steps.items():
            median = statistics.median(values)
            print(f"  fork step {name:26s} p50 {median:6.0f} ms  (n={len(values)})")


async def ms(coro: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = await coro
    return (time.perf_counter() - started) * 1000, value


async def timings(root: Path, runs: int) -> None:
    print("== 1. pause / resume / fork of a python session holding 50 MB, against opening one ==")
    pauses: list[float] = []
    resumes: list[float] = []
    forks: list[float] = []
    l1_opens: list[float] = []
    cold_opens: list[float] = []
    sizes: list[int] = []
    async with (
        Scheduler(config(root)) as sched,
        Scheduler(config(root, memory_snapshots=False)) as cold,
    ):
        assert await sched.prepare_snapshot("python")
        for _ in range(runs):
            took, session = await ms(sched.session())
            l1_opens.append(took)
            took, other = await ms(cold.session())
            cold_opens.append(took)
            await other.close()
            await session.exec(DATA)
            took, snapshot = await ms(session.pause())
            pauses.append(took)
            sizes.append(snapshot.size_bytes)
            took, resumed = await ms(sched.resume(snapshot))
            resumes.append(took)
            took, child = await ms(resumed.fork())
            forks.append(took)
            assert (await child.exec("print(blob[4096])")).stdout == f"{4096 % 251}\n"
            await child.close()
            await resumed.close()
            await sched.delete_snapshot(snapshot)
    print("fork(1) by step:")
    STEPS.report()
    print(f"state on disk: {sum(sizes) / len(sizes) / 1e6:.0f} MB")
    for name, values in (
        ("pause", pauses),
        ("resume", resumes),
        ("fork(1)", forks),
        ("open: L1 restore", l1_opens),
        ("open: cold boot", cold_opens),
    ):
        print(f"{name:17s} {summary(values)}")
    print(
        f"resume / L1 open = {percentile(resumes, 50) / percentile(l1_opens, 50):.2f}x; "
        f"fork / L1 open = {percentile(forks, 50) / percentile(l1_opens, 50):.2f}x"
    )


async def memory(root: Path) -> None:
    print("\n== 2. host memory (PSS of QEMU) of N forks against N independent sessions ==")
    for n in (1, 5, 10):
        async with Scheduler(config(root)) as sched:
            parent = await sched.session()
            await parent.exec(DATA)
            children = await parent.fork(n)
            assert isinstance(children, list)
            await asyncio.sleep(2)
            forked = pss_mb([c._vm.pid for c in children])
            for c in children:
                await c.close()
            await parent.close()
            independent: list[Session] = []
            for _ in range(n):
                s = await sched.session()
                await s.exec(DATA)
                independent.append(s)
            await asyncio.sleep(2)
            alone = pss_mb([s._vm.pid for s in independent])
            for s in independent:
                await s.close()
        # The template memfd of several forks is allocated whole (its holes filled,
        # session_snapshots.py) and only its mapped pages are in the forks' PSS: count the
        # guest's RAM size on top. A single fork has no template (its RAM is private).
        template = sched.config.default_memory_mb if n > 1 else 0
        print(
            f"{n:2d}: forks {forked:7.0f} MB + template {template} MB = {forked + template:7.0f} MB"
            f"   independent sessions {alone:7.0f} MB   ratio {(forked + template) / alone:.2f}"
        )


STEPS = StepLog()


async def main() -> None:
    logger = logging.getLogger("exec_sandbox")
    logger.addHandler(STEPS)
    logger.setLevel(logging.DEBUG)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sbx-bench-sessions-") as tmp:
        await timings(Path(tmp), args.runs)
        await memory(Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
