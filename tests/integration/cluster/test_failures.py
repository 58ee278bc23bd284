"""Failures of a cluster host: its sessions end clearly, the other host goes on, and nothing of a
shut-down cluster keeps running."""

from __future__ import annotations

import pytest

from exec_sandbox import SessionClosedError
from exec_sandbox.cluster import ClusterScheduler
from tests.helpers import qemu_processes

from .conftest import HOST_CONFIG, LocalCluster

pytestmark = [pytest.mark.vm, pytest.mark.cluster]


async def test_killing_a_host_node_closes_its_sessions_and_the_other_host_serves(
    own_cluster: LocalCluster,
) -> None:
    async with ClusterScheduler(address=own_cluster.cluster.address, config=HOST_CONFIG) as client:
        await own_cluster.record_hosts(client)
        # One VM per host: the two sessions are on different hosts.
        doomed = await client.session()
        survivor = await client.session()
        assert doomed.host != survivor.host
        await doomed.exec("x = 1")

        own_cluster.cluster.remove_node(own_cluster.node_of(doomed.host))

        with pytest.raises(SessionClosedError):
            await doomed.exec("print(x)")
        assert doomed.closed
        with pytest.raises(SessionClosedError):
            await client.attach(doomed.session_id)
        assert (await survivor.exec("print('still here')")).stdout == "still here\n"
        await survivor.close()
        # New work goes to the host that is left.
        assert (await client.run("print(2 + 2)")).stdout == "4\n"
        assert [h.name for h in await client.hosts()] == [survivor.host]


async def test_no_qemu_process_left_after_the_cluster_shuts_down(
    own_cluster: LocalCluster,
) -> None:
    client = ClusterScheduler(address=own_cluster.cluster.address, config=HOST_CONFIG)
    await client.start()
    await own_cluster.record_hosts(client)
    sessions = [await client.session(), await client.session()]
    assert {s.host for s in sessions} == {h.name for h in await client.hosts()}
    qemus = {pid for host in own_cluster.host_pids for pid in qemu_processes(parent=host)}
    assert len(qemus) == 2  # one session VM on each host

    # Shut down with both sessions open: the hosts' processes end, and their VMs with them.
    own_cluster.shutdown()

    assert not [pid for pid in qemu_processes() if pid in qemus]
    assert not [pid for host in own_cluster.host_pids for pid in qemu_processes(parent=host)]
