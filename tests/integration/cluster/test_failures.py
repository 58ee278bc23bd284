"""Failures of a cluster host: its sessions end clearly, the other host goes on, and nothing of a
shut-down cluster keeps running."""

from __future__ import annotations

import asyncio

import pytest
import ray

from exec_sandbox import CommunicationOutcomeUnknownError, SessionClosedError
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


async def test_a_restarted_host_comes_back_empty_and_takes_new_work(
    own_cluster: LocalCluster,
) -> None:
    """A host actor whose process dies (not its node) is restarted by Ray on its node, empty:
    its sessions are gone for good, and it takes new work."""
    async with ClusterScheduler(address=own_cluster.cluster.address, config=HOST_CONFIG) as client:
        await own_cluster.record_hosts(client)
        session = await client.session()
        await session.exec("x = 1")
        before = {h.name: h.pid for h in await client.hosts()}
        ray.kill(ray.get_actor(session.host, namespace=client._namespace), no_restart=False)

        # Ray cannot tell whether a call that met the restart ran: the first exec may be
        # outcome-unknown (never retried); either way the session is over.
        with pytest.raises((SessionClosedError, CommunicationOutcomeUnknownError)):
            await session.exec("print(x)")
        with pytest.raises(SessionClosedError):
            await session.exec("print(x)")
        restarted = None
        for _ in range(300):  # hang guard: Ray restarts the actor within seconds
            current = {h.name: h.pid for h in await client.hosts()}
            if current.get(session.host, before[session.host]) != before[session.host]:
                restarted = current
                break
            await asyncio.sleep(0.2)
        assert restarted is not None and set(restarted) == set(before)
        own_cluster.host_pids.update(restarted.values())
        with pytest.raises(SessionClosedError):
            await client.attach(session.session_id)
        # One VM per host: two new sessions take one host each, the restarted one included.
        fresh = [await client.session(), await client.session()]
        assert {s.host for s in fresh} == set(before)
        again = next(s for s in fresh if s.host == session.host)
        assert (await again.exec("print('x' in globals())")).stdout == "False\n"
        for s in fresh:
            await s.close()
