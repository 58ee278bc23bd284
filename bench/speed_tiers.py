"""Speed tiers, all in one run on this machine:

1. latency of run() per language for each path (warm pool hit, L1 snapshot restore, cold
   boot) against spawning the same interpreter on the host, interleaved so both see the same
   load; plus the channel round trip (PING) to a booted guest;
2. sustained throughput of fresh-VM run() calls, with and without snapshots;
3. host memory (PSS, RSS) and CPU of idle pool VMs (snapshot clones, and cold-booted VMs) for
   1, 5 and 10 VMs;
4. JavaScript start-up: run() and session start per path, with a node parked in the
   javascript template and without one, and cold boots with node's startup snapshot and without
   (before/after), against `node -e` on the host.

    .venv/bin/python bench/speed_tiers.py --runs 10
    .venv/bin/python bench/speed_tiers.py --only javascript --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import config, host_spawn_ms, percentile, summary, timed

from exec_sandbox import Scheduler
from exec_sandbox.provisioning.provisioner import Phases as _Phases
from exec_sandbox.snapshots import l1, node_startup
from exec_sandbox.vm.guest import GuestVm

CASES = {
    "python": ("print(1)", ["python3", "-c", "print(1)"]),
    "javascript": ("console.log(1)", ["node", "-e", "console.log(1)"]),
    "raw": ("echo 1", ["bash", "-c", "echo 1"]),
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


async def latency(cache: Path, runs: int) -> None:
    print("== 1. run() latency per path (ms) ==")
    paths = {
        "warm pool hit": config(cache, warm_pool_size=1),
        "L1 restore": config(cache, warm_pool_size=0),
        "cold boot": config(cache, warm_pool_size=0, memory_snapshots=False),
    }
    for language, (code, host_argv) in CASES.items():
        print(f"\n{language}")
        hosts: list[float] = []
        medians: dict[str, float] = {}
        for path, cfg in paths.items():
            async with Scheduler(cfg) as sched:
                if path != "cold boot":
                    assert await sched.prepare_snapshot(language)  # type: ignore[arg-type]
                totals: list[float] = []
                phases: dict[str, list[float]] = {
                    "restore": [],
                    "connect": [],
                    "boot": [],
                    "execute": [],
                }
                for _ in range(runs):
                    if path == "warm pool hit":
                        await sched.wait_pool_ready(timeout=300)
                        await asyncio.sleep(0.5)  # let the refilled VM settle to idle
                    hosts.append(await host_spawn_ms(host_argv))
                    ms, result = await timed(lambda: sched.run(code, language=language))  # type: ignore[arg-type]  # noqa: B023
                    assert result.stdout == "1\n", result  # type: ignore[attr-defined]
                    hit = {
                        "warm pool hit": result.warm_pool_hit,  # type: ignore[attr-defined]
                        "L1 restore": result.l1_cache_hit and not result.warm_pool_hit,  # type: ignore[attr-defined]
                        "cold boot": not result.l1_cache_hit,
                    }[path]  # type: ignore[attr-defined]
                    assert hit, f"{path} run was not served by that path: {result}"
                    totals.append(ms)
                    timing = result.timing  # type: ignore[attr-defined]
                    phases["restore"].append(timing.restore_ms)
                    phases["connect"].append(timing.connect_ms)
                    phases["boot"].append(timing.boot_ms)
                    phases["execute"].append(timing.execute_ms)
                medians[path] = percentile(totals, 50)
                print(f"  {path:<14} {summary(totals)}")
                split = ", ".join(
                    f"{name} {percentile(values, 50):.0f}"
                    for name, values in phases.items()
                    if any(values)
                )
                print(f"  {'':<14} p50 of phases: {split} ms")
        host_p50 = percentile(hosts, 50)
        print(f"  host {host_argv[0]:<9} {summary(hosts)}")
        for path, p50 in medians.items():
            print(f"  ratio {path} / host spawn (p50): {p50 / host_p50:.2f}x")


async def channel_round_trip(cache: Path) -> None:
    async with Scheduler(config(cache)) as sched:
        vm, _ = await sched._provisioner.start_pool_vm("python")
        try:
            times = []
            for _ in range(300):
                ms, _ = await timed(vm.ping)
                times.append(ms)
        finally:
            vm.close()
    print(f"\nchannel round trip (PING/PONG) {summary(times)}")


async def throughput(cache: Path, calls: int) -> None:
    print(f"\n== 2. sustained throughput: {calls} fresh-VM run('print(1)'), 2 at a time ==")
    for label, cfg in (
        ("with snapshots", config(cache)),
        ("without snapshots", config(cache, memory_snapshots=False)),
    ):
        async with Scheduler(cfg) as sched:
            if cfg.memory_snapshots:
                assert await sched.prepare_snapshot("python")
            slots = asyncio.Semaphore(2)

            async def one() -> None:
                async with slots:  # noqa: B023
                    result = await sched.run("print(1)")
                    assert result.stdout == "1\n"

            started = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(calls)))
            elapsed = time.perf_counter() - started
        print(f"  {label:<18} {calls / elapsed:5.2f} runs/s  ({elapsed:.1f} s)")


def cfg_memory(sched: Scheduler) -> int:
    return sched.config.default_memory_mb


def pss_rss_kb(pid: int) -> tuple[int, int]:
    pss = rss = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    return pss, rss


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def idle_cost(cache: Path, counts: list[int], window: float) -> None:
    print(f"\n== 3. idle pool VMs: host memory and CPU (CPU over {window:.0f} s) ==")
    variants = (
        # label, snapshots, warm_up: pool VMs are warmed up (one run of the interpreter, which
        # also fills QEMU's translation cache); "not warmed" shows what that run costs in memory.
        ("snapshot clones", True, True),
        ("clones, not warmed", True, False),
        ("cold-booted", False, True),
    )
    for label, snapshots, warm in variants:
        async with Scheduler(config(cache, memory_snapshots=snapshots)) as sched:
            if snapshots:
                assert await sched.prepare_snapshot("python")
            vms: list[GuestVm] = []
            try:
                for count in counts:
                    while len(vms) < count:
                        if warm:
                            vm, restored = await sched._provisioner.start_pool_vm("python")
                        else:
                            phases = _Phases()
                            vm = await sched._provisioner.start_vm(
                                "python", cfg_memory(sched), phases
                            )
                            restored = phases.l1_hit
                        assert restored == snapshots
                        vms.append(vm)
                    await asyncio.sleep(2.0)  # settle after the last start
                    before = {vm.pid: cpu_ticks(vm.pid) for vm in vms}
                    await asyncio.sleep(window)
                    cpu = [
                        (cpu_ticks(vm.pid) - before[vm.pid]) / CLK_TCK / window * 100 for vm in vms
                    ]
                    mem = [pss_rss_kb(vm.pid) for vm in vms]
                    pss_total = sum(p for p, _ in mem) / 1024
                    rss_total = sum(r for _, r in mem) / 1024
                    print(
                        f"  {label:<18} {count:2d} VMs: PSS total {pss_total:7.1f} MB "
                        f"({pss_total / count:6.1f}/VM), RSS total {rss_total:7.1f} MB, "
                        f"CPU per VM mean {sum(cpu) / count:4.2f} % max {max(cpu):4.2f} % "
                        "of a core"
                    )
            finally:
                for vm in vms:
                    vm.close()


async def javascript_start(cache: Path, runs: int) -> None:
    """run() and session start for JavaScript per path. L1: before (a template with node's
    startup snapshot but no parked node: l1.NODE_PARKED_IN_TEMPLATES off) and after (a node
    parked in it, which a clone's first run or session REPL uses). Cold boot: before (node starts
    without a startup snapshot: node_startup.GIVE_TO_COLD_BOOTS off) and after (the snapshot the
    L1-after template left in its cache directory is written into the VM before node starts).
    The paths take turns, one call each, so that a change of the machine's load reaches all of
    them alike; the host baseline is taken before each call."""
    print("\n== 4. JavaScript start-up: run('console.log(1)') and session start (ms) ==")
    code, host_argv = CASES["javascript"]
    hosts: list[float] = []
    rows: dict[str, list[float]] = {}
    # label: (memory snapshots, node parked in the template, node's startup snapshot given to
    # cold boots, cache directory, path that must serve)
    paths = {
        "cold boot, before": (False, True, False, "l1-after", "cold"),
        "cold boot, after": (False, True, True, "l1-after", "cold"),
        "L1 restore, before": (True, False, True, "l1-before", "l1"),
        "L1 restore, after": (True, True, True, "l1-after", "l1"),
    }

    async def one_run(sched: Scheduler, label: str, want: str) -> None:
        hosts.append(await host_spawn_ms(host_argv))
        ms, result = await timed(lambda: sched.run(code, language="javascript"))
        assert result.stdout == "1\n", result  # type: ignore[attr-defined]
        served = (
            "pool"
            if result.warm_pool_hit
            # type: ignore[attr-defined]
            else "l1"
            if result.l1_cache_hit
            else "cold"
        )  # type: ignore[attr-defined]
        assert served == want, f"{label}: served by {served}, not {want}"
        rows.setdefault(f"run, {label}", []).append(ms)

    try:
        async with contextlib.AsyncExitStack() as stack:
            scheds: dict[str, Scheduler] = {}
            # The L1 paths first: the after template leaves node's startup snapshot in its
            # directory, where the cold boots of the after path find it.
            for label, (snaps, parked, _, directory, _) in sorted(
                paths.items(), key=lambda item: not item[1][0]
            ):
                l1.NODE_PARKED_IN_TEMPLATES = parked
                sched = await stack.enter_async_context(
                    Scheduler(config(cache / directory, warm_pool_size=0, memory_snapshots=snaps))
                )
                if snaps:
                    assert await sched.prepare_snapshot("javascript")
                scheds[label] = sched
            assert list((cache / "l1-after").glob("node-startup-*.blob")), "no blob was kept"
            for _ in range(runs):
                for label, (_, parked, give, _, want) in paths.items():
                    # Read at every lookup of the template's key: set for the path's turn.
                    l1.NODE_PARKED_IN_TEMPLATES = parked
                    node_startup.GIVE_TO_COLD_BOOTS = give
                    await one_run(scheds[label], label, want)
                    hosts.append(await host_spawn_ms(host_argv))
                    started = time.perf_counter()
                    async with await scheds[label].session(language="javascript"):
                        rows.setdefault(f"session start, {label}", []).append(
                            (time.perf_counter() - started) * 1000
                        )
        # Pool hits: one scheduler at a time, since its refills run in the background and look
        # the template up with the switch of the moment; before and after alternate, twice.
        for when, parked in (("before", False), ("after", True)) * 2:
            l1.NODE_PARKED_IN_TEMPLATES = parked
            cfg = config(cache / f"pool-{when}", warm_pool_size={"javascript": 1})
            async with Scheduler(cfg) as sched:
                assert await sched.prepare_snapshot("javascript")
                for _ in range((runs + 1) // 2):
                    await sched.wait_pool_ready(timeout=300)
                    await asyncio.sleep(0.5)  # let the refilled VM settle to idle
                    await one_run(sched, f"pool hit, {when}", "pool")
    finally:
        l1.NODE_PARKED_IN_TEMPLATES = True
        node_startup.GIVE_TO_COLD_BOOTS = True
    host_p50 = percentile(hosts, 50)
    for label in sorted(rows):
        values = rows[label]
        print(f"  {label:<34} {summary(values)}  {percentile(values, 50) / host_p50:6.1f}x host")
    print(f"  {'host node -e':<34} {summary(hosts)}")


async def main(runs: int, calls: int, counts: list[int], window: float, sections: set[str]) -> None:
    from exec_sandbox.vm import host_facts

    print(
        f"accelerator: {host_facts.accelerator()}; cores: {os.cpu_count()}; {runs} runs per cell\n"
    )
    with tempfile.TemporaryDirectory(prefix="sbx-bench-") as tmp:
        cache = Path(tmp)
        if "latency" in sections:
            await latency(cache, runs)
            await channel_round_trip(cache)
        if "throughput" in sections:
            await throughput(cache, calls)
        if "idle" in sections:
            await idle_cost(cache, counts, window)
        if "javascript" in sections:
            await javascript_start(cache, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--vms", type=int, nargs="+", default=[1, 5, 10])
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["latency", "throughput", "idle", "javascript"],
        default=["latency", "throughput", "idle", "javascript"],
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.calls, args.vms, args.window, set(args.only)))
