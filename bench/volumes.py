"""Volumes: what attaching one costs a run. Every VM with volumes is cold-booted, so the
baseline is a cold run without a volume (memory snapshots off), interleaved in the same run:
the first run on a fresh volume (the guest formats it: mke2fs), later read-write runs (mount,
plus the freeze that makes the exec's writes durable before its EXIT) and read-only runs. Also
the host disk a fresh 1 GB volume takes after its format (sparse), and what that freeze costs
a session's exec (against an exec in a session without a volume).

    .venv/bin/python bench/volumes.py --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import config, percentile, summary, timed

from exec_sandbox import Scheduler, Volume, VolumeMount


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = config(root / "cache", memory_snapshots=False, volume_dir=root / "volumes")
        async with Scheduler(cfg) as scheduler:
            await scheduler.run("pass")  # page cache and QEMU's first start
            plain: list[float] = []
            fresh: list[float] = []
            rw: list[float] = []
            ro: list[float] = []

            async def run_ms(
                code: str, volumes: dict[str, Volume | VolumeMount] | None = None
            ) -> float:
                ms, _ = await timed(lambda: scheduler.run(code, volumes=volumes))
                return ms

            write = "open('/mnt/v/x', 'w').write('1')"
            for i in range(runs):  # interleaved: every path sees the same noise
                volume = await scheduler.volume(f"bench{i}", size_mb=1024)
                plain.append(await run_ms("pass"))
                fresh.append(await run_ms(write, {"/mnt/v": volume}))
                rw.append(await run_ms(write, {"/mnt/v": volume}))
                ro.append(await run_ms("open('/mnt/v/x').read()", {"/mnt/v": volume.read_only()}))
            used = (cfg.volume_dir / "bench0.img").stat().st_blocks * 512
            base = percentile(plain, 50)
            for name, values in (
                ("cold run, no volume", plain),
                ("first run on a fresh 1 GB volume", fresh),
                ("run on a formatted volume, rw", rw),
                ("run on a formatted volume, ro", ro),
            ):
                print(f"{name:34s} {summary(values)}  x{percentile(values, 50) / base:.2f}")
            print(f"host disk used by a fresh 1 GB volume after its format: {used / 1e6:.2f} MB")
            await session_execs(scheduler, runs * 8)


async def session_execs(scheduler: Scheduler, runs: int) -> None:
    """What the freeze before each EXIT costs a session's exec: `exec("pass")` without a volume
    and with a read-write one, and an exec that writes 4 KiB to it, interleaved."""
    volume = await scheduler.volume("bench-session", size_mb=256)
    plain = await scheduler.session()
    with_volume = await scheduler.session(volumes={"/mnt/v": volume})
    async with plain, with_volume:
        base: list[float] = []
        idle: list[float] = []
        writing: list[float] = []
        for i in range(runs):
            base.append((await timed(lambda: plain.exec("pass")))[0])
            idle.append((await timed(lambda: with_volume.exec("pass")))[0])
            code = f"open('/mnt/v/f{i}', 'w').write('x' * 4096)"
            writing.append((await timed(lambda: with_volume.exec(code)))[0])  # noqa: B023
        p50 = percentile(base, 50)
        for name, values in (
            ("session exec, no volume", base),
            ("session exec, rw volume", idle),
            ("session exec writing 4 KiB to it", writing),
        ):
            print(f"{name:34s} {summary(values)}  x{percentile(values, 50) / p50:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args().runs))
