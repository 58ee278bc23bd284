"""Background processes: a spawn round trip (`session.spawn(["true"])` + `wait()`) against
`session.exec` of `true` in a raw (bash) session, interleaved in the same run, plus the host's
own spawn of `true` as the floor. The spawn path forks and execs a new program in the guest on
every call; the exec path runs in the REPL that already lives, so the ratio says what a fresh
process costs over a REPL round trip. Also: read throughput of a process's output pulled from
the guest's ring (PROC_READ chunks) against `session.read_file` of the same bytes.

    .venv/bin/python bench/processes.py --runs 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import host_spawn_ms, percentile, summary, timed

from exec_sandbox import Scheduler, SchedulerConfig


async def main(runs: int) -> None:
    async with Scheduler(SchedulerConfig(max_concurrent_vms=1)) as scheduler:
        async with await scheduler.session(language="raw") as session:
            # Warm both paths once (page cache, the REPL's first command).
            await (await session.spawn(["true"])).wait()
            await session.exec("true")
            spawn_ms: list[float] = []
            exec_ms: list[float] = []
            host_ms: list[float] = []
            for _ in range(runs):  # interleaved: both see the same noise

                async def spawn_and_wait() -> int:
                    return await (await session.spawn(["true"])).wait()

                ms, code = await timed(spawn_and_wait)
                assert code == 0
                spawn_ms.append(ms)
                ms, result = await timed(lambda: session.exec("true"))
                exec_ms.append(ms)
                host_ms.append(await host_spawn_ms(["true"]))
            print(f"spawn + wait of true      {summary(spawn_ms)}")
            print(f"session.exec('true')      {summary(exec_ms)}")
            print(f"host spawn of true        {summary(host_ms)}")
            print(
                f"ratio spawn / exec: p50 {percentile(spawn_ms, 50) / percentile(exec_ms, 50):.2f}"
                f"  mean {statistics.fmean(spawn_ms) / statistics.fmean(exec_ms):.2f}"
            )

            # Output throughput: 1 MiB (what the ring keeps of a stream), also teed into a
            # file; both are read back once the process ended.
            size = 1024 * 1024
            writer = await session.spawn(
                f"head -c {size} /dev/zero | tr '\\0' y | tee /home/user/out.bin"
            )
            assert await writer.wait(timeout=300) == 0
            started = time.perf_counter()
            got = await writer.stdout.read()
            proc_s = time.perf_counter() - started
            started = time.perf_counter()
            file = await session.read_file("out.bin")
            file_s = time.perf_counter() - started
            assert got == file and len(got) == size
            print(
                f"output of 1 MiB: process reader {size / proc_s / 1e6:6.1f} MB/s, "
                f"read_file {size / file_s / 1e6:6.1f} MB/s, "
                f"(reader / read_file {file_s / proc_s:.2f})"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.runs))
