"""A local Ray cluster for the ClusterScheduler tests: a head that runs nothing (num_cpus=0)
and two host nodes advertising `sandbox_host`, all on this machine (ray.cluster_utils.Cluster).
Small host configs: one VM per host, no memory snapshots, no warm pool.

Teardown proves that nothing outlives the cluster: Ray's daemons and workers end with
`Cluster.shutdown()`, and no QEMU started by a host actor is left (PR_SET_PDEATHSIG ties each
QEMU to its host actor's process)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("EXEC_SANDBOX_SKIP_CLUSTER_TESTS") == "1":
    pytest.skip("EXEC_SANDBOX_SKIP_CLUSTER_TESTS=1 set by the caller", allow_module_level=True)

import ray
from ray.cluster_utils import Cluster

from exec_sandbox import SchedulerConfig
from exec_sandbox.cluster import NAMESPACE, ClusterScheduler
from tests.helpers import qemu_processes

HOST_CONFIG = SchedulerConfig(
    max_concurrent_vms=1, memory_snapshots=False, warm_pool_size=0, admission_timeout_seconds=60
)


@dataclass
class LocalCluster:
    cluster: Cluster
    nodes: list[Any]
    # Host actor process ids seen by the tests (checked for leftover QEMU at teardown).
    host_pids: set[int] = field(default_factory=set)

    def node_of(self, host_name: str) -> Any:
        return next(n for n in self.nodes if host_name.endswith(n.node_id))

    shut_down: bool = False

    async def record_hosts(self, client: ClusterScheduler) -> None:
        self.host_pids.update(h.pid for h in await client.hosts())

    def shutdown(self) -> None:
        """Disconnect and stop every Ray process of the cluster, then check that the host
        actors and each QEMU they ran are gone. Idempotent."""
        if self.shut_down:
            return
        self.shut_down = True
        qemus = {pid for host in self.host_pids for pid in qemu_processes(parent=host)}
        ray.shutdown()
        self.cluster.shutdown()
        _assert_gone(self.host_pids | qemus, "host actors and their QEMU processes")


@contextmanager
def local_cluster(hosts: int = 2) -> Iterator[LocalCluster]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    started = LocalCluster(cluster, [])
    try:
        for _ in range(hosts):
            started.nodes.append(
                cluster.add_node(
                    num_cpus=1, resources={"sandbox_host": 1}, object_store_memory=100 << 20
                )
            )
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        asyncio.run(_create_hosts(started))
        yield started
    finally:
        started.shutdown()


async def _create_hosts(started: LocalCluster) -> None:
    """The host actors, made now with HOST_CONFIG: the first client to reach a host creates it
    with its own config, whatever test or command (`sbx run --cluster`) that is."""
    async with ClusterScheduler(address=started.cluster.address, config=HOST_CONFIG) as client:
        await started.record_hosts(client)
        assert len(started.host_pids) == len(started.nodes)


def _assert_gone(pids: set[int], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)}
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} outlived the cluster: pids {sorted(alive)}")


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.fixture(scope="module")
def shared_cluster(images_dir_ready: None) -> Iterator[LocalCluster]:
    """One cluster for the tests of a module that leave its nodes alive."""
    with local_cluster() as started:
        yield started


@pytest.fixture
def own_cluster(images_dir_ready: None) -> Iterator[LocalCluster]:
    """A cluster of its own, for a test that kills a node or shuts the cluster down."""
    with local_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def images_dir_ready() -> None:
    from exec_sandbox.images.catalog import MANIFEST_NAME
    from exec_sandbox.paths import images_dir

    manifest = images_dir() / MANIFEST_NAME
    assert manifest.is_file(), f"{manifest} missing: run `make images` before the VM tests"


@pytest.fixture
async def client(shared_cluster: LocalCluster) -> AsyncIterator[ClusterScheduler]:
    async with ClusterScheduler(
        address=shared_cluster.cluster.address, config=HOST_CONFIG
    ) as scheduler:
        await shared_cluster.record_hosts(scheduler)
        yield scheduler
