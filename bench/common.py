"""Helpers for the benchmarks: percentile summaries and host baselines measured in the same run
(these machines are shared and noisy, so only ratios against a same-run baseline mean much)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from exec_sandbox import SchedulerConfig


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float]) -> str:
    return (
        f"p50 {percentile(values, 50):8.1f} ms  p95 {percentile(values, 95):8.1f} ms  "
        f"mean {statistics.fmean(values):8.1f} ms  (n={len(values)})"
    )


async def host_spawn_ms(argv: Sequence[str]) -> float:
    """Wall time of spawning argv on the host and waiting for it: the baseline."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await proc.wait()
    return (time.perf_counter() - started) * 1000


async def timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, object]:
    started = time.perf_counter()
    value = await fn()
    return (time.perf_counter() - started) * 1000, value


def config(cache: Path, **overrides: object) -> SchedulerConfig:
    """A scheduler for a bench: its own snapshot cache, room for many VMs at once."""
    values: dict[str, object] = {
        "memory_snapshot_cache_dir": cache,
        "max_concurrent_vms": 12,
        "cpu_overcommit_ratio": 8.0,
    }
    values.update(overrides)
    return SchedulerConfig(**values)  # type: ignore[arg-type]
