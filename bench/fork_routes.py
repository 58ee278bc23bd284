"""fork(1)'s route against the one it replaced, alternating on one parent in one process (the
host is shared and noisy: only ratios within one run mean something):

- pipe: the parent's stream QEMU to QEMU into a receiver started while the parent runs
  (snapshots/forks.py fork_vms for one copy);
- file: the parent's stream saved to a file, then loaded into a new VM with private RAM (the
  save and load a fork did before, without its template).

    .venv/bin/python bench/fork_routes.py --runs 6
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from session_snapshots import DATA, config

from exec_sandbox import Scheduler
from exec_sandbox.snapshots import forks
from exec_sandbox.vm import migration
from exec_sandbox.vm.guest import GuestVm

TIMEOUT = 60.0


async def by_pipe(vm: GuestVm) -> tuple[float, float]:
    started = time.perf_counter()
    copy = (await forks.fork_vms(vm, 1, Path("/nonexistent"), timeout=TIMEOUT))[0]
    took = (time.perf_counter() - started) * 1000
    stream = copy.restore_seconds * 1000
    await copy.aclose()
    return took, stream


async def by_file(vm: GuestVm, work: Path) -> tuple[float, float]:
    started = time.perf_counter()
    await migration.save_state(vm, str(work / "full"))
    saved = time.perf_counter()
    await migration.cont(vm)
    await vm.reseed()
    copy = await forks.load_vm(vm.spec, str(work / "full"), registry=None, timeout=TIMEOUT)
    took = (time.perf_counter() - started) * 1000
    (work / "full").unlink()
    await copy.aclose()
    return took, (saved - started) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    pipe: list[float] = []
    file: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sbx-bench-fork-") as tmp:
        async with Scheduler(config(Path(tmp))) as sched:
            assert await sched.prepare_snapshot("python")
            session = await sched.session()
            await session.exec(DATA)
            for _ in range(args.runs):
                took, stream = await by_pipe(session.vm)
                pipe.append(took)
                async with sched._paused.store.build_dir() as work:
                    took_file, save = await by_file(session.vm, work)
                file.append(took_file)
                print(
                    f"pipe {took:6.0f} ms (stream {stream:4.0f})   "
                    f"file {took_file:6.0f} ms (save {save:4.0f})",
                    flush=True,
                )
            await session.close()
    print(
        f"p50: pipe {statistics.median(pipe):.0f} ms, file {statistics.median(file):.0f} ms, "
        f"pipe / file = {statistics.median(pipe) / statistics.median(file):.2f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())
