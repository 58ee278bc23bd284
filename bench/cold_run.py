"""Cold `Scheduler.run()` latency per language (a fresh VM booted for every call), split into
boot and interpreter/execution, against spawning the same interpreter on the host in the same run.

    .venv/bin/python bench/cold_run.py --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import host_spawn_ms, percentile, summary, timed

from exec_sandbox import Scheduler, SchedulerConfig

CASES = {
    "python": ("print(1)", ["python3", "-c", "print(1)"]),
    "javascript": ("console.log(1)", ["node", "-e", "console.log(1)"]),
    "raw": ("echo 1", ["bash", "-c", "echo 1"]),
}


async def main(runs: int) -> None:
    # Snapshots off: every call boots (bench/speed_tiers.py measures the faster paths).
    async with Scheduler(SchedulerConfig(memory_snapshots=False)) as scheduler:
        print(f"accelerator: {scheduler.accelerator}; {runs} sequential runs per language\n")
        for language, (code, host_argv) in CASES.items():
            totals, boots, executes, hosts = [], [], [], []
            for _ in range(runs):
                # Interleave the baseline with the VM runs so both see the same machine load.
                hosts.append(await host_spawn_ms(host_argv))
                total, result = await timed(
                    lambda c=code, lang=language: scheduler.run(c, language=lang)
                )
                assert result.exit_code == 0 and result.stdout == "1\n", result  # type: ignore[attr-defined]
                totals.append(total)
                boots.append(result.timing.boot_ms)  # type: ignore[attr-defined]
                executes.append(result.timing.execute_ms)  # type: ignore[attr-defined]
            ratio = percentile(totals, 50) / percentile(hosts, 50)
            print(f"{language}")
            print(f"  run() total      {summary(totals)}")
            print(f"    boot           {summary(boots)}")
            print(f"    execute        {summary(executes)}")
            print(f"  host {' '.join(host_argv[:2]):<11} {summary(hosts)}")
            print(f"  ratio run()/host p50: {ratio:.1f}x\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))
