"""What verifying an L1 snapshot's RAM costs: the first restore of a configuration in a
scheduler makes the sealed memfd copy clones map (RamFiles.fd_for), and now also hashes it
against the digest recorded at build time. Measured on a real template's RAM file, interleaved:
the copy alone (the baseline, what fd_for did before) and copy + digest (what it does now).

    .venv/bin/python bench/snapshot_digest.py --runs 15
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.snapshots.ram import _data_ranges, _memfd_digest, _sealed_copy


async def build_template(cache: Path, language: str) -> Path:
    async with Scheduler(SchedulerConfig(memory_snapshot_cache_dir=cache)) as sched:
        if not await sched.prepare_snapshot(language):  # type: ignore[arg-type]
            raise SystemExit("could not build the snapshot")
    (directory,) = [p for p in cache.iterdir() if p.name.startswith(language)]
    return directory / "ram"


def copy_ms(ram: Path, digest: bool) -> float:
    started = time.perf_counter()
    with open(ram, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        fd = _sealed_copy(f.fileno(), size)
    try:
        if digest:
            _memfd_digest(fd, size)
    finally:
        os.close(fd)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--language", default="python")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sbx-bench-digest-") as tmp:
        ram = asyncio.run(build_template(Path(tmp), args.language))
        size = ram.stat().st_size
        with open(ram, "rb") as f:
            data = sum(end - start for start, end in _data_ranges(f.fileno(), size))
        print(
            f"{args.language} template RAM: {size / 2**20:.0f} MiB, "
            f"{data / 2**20:.1f} MiB of data; {args.runs} runs each, interleaved"
        )
        copy_only: list[float] = []
        with_digest: list[float] = []
        copy_ms(ram, True)  # page cache warm, as for a restore right after a build
        for _ in range(args.runs):
            copy_only.append(copy_ms(ram, False))
            with_digest.append(copy_ms(ram, True))
    print(f"  sealed copy          {summary(copy_only)}")
    print(f"  sealed copy + digest {summary(with_digest)}")
    extra = percentile(with_digest, 50) - percentile(copy_only, 50)
    print(
        f"  digest adds p50 {extra:.1f} ms ({percentile(with_digest, 50) / percentile(copy_only, 50):.2f}x"  # noqa: E501
        f" the copy), once per scheduler and configuration"
    )


if __name__ == "__main__":
    main()
