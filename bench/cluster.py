"""ClusterScheduler benchmarks, in one run:

* overhead: the same `run("print(1)")` through a local Scheduler and through a ClusterScheduler
  whose one host node has the same config, both served from a warm pool of one VM (refilled
  before each timed call), so that what differs is the Ray path: placement (a cached capacity
  read), the streaming call to the host actor and the result coming back. Also the bare round
  trip of a host actor call (info()), the floor of that path;
* throughput: `--jobs` concurrent cold runs over a cluster of one host node, then of two (each
  host admits `--vms-per-host` VMs). On one machine, two host nodes share the same cores.

    .venv/bin/python bench/cluster.py --runs 30 --jobs 12

Starts a local Ray cluster (ray.cluster_utils.Cluster) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray
from common import percentile, summary
from ray.cluster_utils import Cluster

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.cluster import (
    NAMESPACE,
    ClusterScheduler,
    _ray,
)

CODE = "print(1)"


@contextmanager
def local_cluster(hosts: int) -> Iterator[Cluster]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(hosts):
            cluster.add_node(
                num_cpus=1, resources={"sandbox_host": 1}, object_store_memory=100 << 20
            )
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


async def local_overhead(runs: int, config: SchedulerConfig) -> list[float]:
    times = []
    async with Scheduler(config) as scheduler:
        for _ in range(runs):
            await scheduler.wait_pool_ready(120)
            await asyncio.sleep(0.3)  # the refill's own work settles
            started = time.perf_counter()
            result = await scheduler.run(CODE)
            times.append((time.perf_counter() - started) * 1000)
            assert result.stdout == "1\n" and result.warm_pool_hit, result
    return times


async def cluster_overhead(runs: int, config: SchedulerConfig) -> tuple[list[float], list[float]]:
    times, trips = [], []
    async with ClusterScheduler(config=config) as cluster:
        (host,) = cluster._hosts.values()
        for _ in range(runs):
            while (await cluster.hosts())[0].capacity.warm_pool.get("python", 0) < 1:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)
            at = time.perf_counter()
            await _ray.call(host.handle, "info")
            trips.append((time.perf_counter() - at) * 1000)
            started = time.perf_counter()
            result = await cluster.run(CODE)
            times.append((time.perf_counter() - started) * 1000)
            assert result.stdout == "1\n" and result.warm_pool_hit, result
    return times, trips


async def throughput(jobs: int, config: SchedulerConfig) -> tuple[float, dict[str, int]]:
    async with ClusterScheduler(config=config) as cluster:
        await cluster.run(CODE)  # hosts started, their caches warm
        before = {h.name: h.runs for h in await cluster.hosts()}
        started = time.perf_counter()
        results = await asyncio.gather(*(cluster.run(CODE) for _ in range(jobs)))
        elapsed = time.perf_counter() - started
        assert all(r.stdout == "1\n" for r in results)
        spread = {h.name[-6:]: h.runs - before[h.name] for h in await cluster.hosts()}
    return jobs / elapsed, spread


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--vms-per-host", type=int, default=2)
    args = parser.parse_args()

    pooled = SchedulerConfig(
        max_concurrent_vms=2, warm_pool_size={"python": 1}, memory_snapshots=False
    )
    local = asyncio.run(local_overhead(args.runs, pooled))
    with local_cluster(1):
        remote, trips = asyncio.run(cluster_overhead(args.runs, pooled))
    print(f"run('{CODE}'), warm-pool hit, sequential:")
    print(f"  local Scheduler      {summary(local)}")
    print(f"  ClusterScheduler     {summary(remote)}")
    print(
        f"  difference           p50 {percentile(remote, 50) - percentile(local, 50):+.1f} ms  "
        f"p95 {percentile(remote, 95) - percentile(local, 95):+.1f} ms"
    )
    print(f"  host actor round trip (info) {summary(trips)}")

    # A queue that holds every job: the bound (4 x VMs by default) is not what is measured here.
    cold: dict[str, Any] = {
        "max_concurrent_vms": args.vms_per_host,
        "memory_snapshots": False,
        "admission_queue_size": args.jobs,
    }
    rates = {}
    for hosts in (1, 2):
        with local_cluster(hosts):
            rate, spread = asyncio.run(throughput(args.jobs, SchedulerConfig(**cold)))
        rates[hosts] = rate
        print(
            f"throughput, {args.jobs} concurrent cold runs, {hosts} host node(s) x "
            f"{args.vms_per_host} VMs: {rate:.2f} runs/s  (runs per host: {spread})"
        )
    print(f"two host nodes / one: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
