"""A session with network paused and resumed, or forked, in real VMs: the relay and the
exposed-port listeners are set up again around the VM's saved state, the guest told to reattach
(net_protocol.h, SBX_NET_CONFIG_REATTACH)."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from exec_sandbox import Scheduler

pytestmark = pytest.mark.vm

PAGE = (
    "import socket, time\n"
    "open('/home/user/page.txt', 'w').write('served by the guest\\n')\n"
    "for _ in range(400):\n"
    "    try:\n"
    "        socket.create_connection(('127.0.0.1', 8000), 1).close(); break\n"
    "    except OSError: time.sleep(0.05)\n"
    "else: raise SystemExit('the server never listened')\n"
)
FETCH = "curl -sS --max-time 20 http://web.test/hello"


async def host_get(url: str) -> bytes:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: urllib.request.urlopen(url, timeout=30).read())


async def test_a_spawned_server_is_reached_again_after_pause_and_resume(
    net_scheduler: Scheduler,
) -> None:
    session = await net_scheduler.session(expose_ports=[8000])
    try:
        await session.spawn(
            ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"], cwd="/home/user"
        )
        result = await session.exec(PAGE)
        assert result.exit_code == 0, result.stderr
        assert await host_get(session.exposed_ports[0].url + "/page.txt") == (
            b"served by the guest\n"
        )
        snapshot = await session.pause()
    finally:
        await session.close()
    # Another scheduler (another process's, as far as the snapshot can tell).
    async with Scheduler(net_scheduler.config) as other:
        async with await other.resume(snapshot) as resumed:
            (exposed,) = resumed.exposed_ports
            assert exposed.internal == 8000
            # The server process lived on in the VM's memory; its new listener reaches it.
            assert await host_get(exposed.url + "/page.txt") == b"served by the guest\n"
        await other.delete_snapshot(snapshot)


async def test_allowed_domains_reach_out_again_after_resume(net_scheduler: Scheduler) -> None:
    async with await net_scheduler.session(
        language="raw", allow_network=True, allowed_domains=["web.test"]
    ) as session:
        first = await session.exec(FETCH)
        assert first.stdout == "hello from the host's loopback\n", first.stderr
        snapshot = await session.pause()
    async with await net_scheduler.resume(snapshot) as resumed:
        again = await resumed.exec(FETCH)
        assert again.stdout == "hello from the host's loopback\n", again.stderr
        assert any(e.name == "web.test" and e.allowed for e in resumed.network_log)
        refused = await resumed.exec("curl -sS --max-time 10 http://other.test/ || echo refused")
        assert "refused" in refused.stdout  # the policy came back with it
    await net_scheduler.delete_snapshot(snapshot)


async def test_a_fork_of_a_networked_session_has_its_own_network(
    net_scheduler: Scheduler,
) -> None:
    async with await net_scheduler.session(
        allow_network=True, allowed_domains=["web.test"], expose_ports=[8000]
    ) as parent:
        await parent.spawn(
            ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"], cwd="/home/user"
        )
        assert (await parent.exec(PAGE)).exit_code == 0
        copy = await parent.fork()
        async with copy:
            (mine,) = parent.exposed_ports
            (its,) = copy.exposed_ports
            assert its.internal == 8000 and its.external != mine.external
            # Each reaches its own VM's server (the copy's process is a copy too).
            await copy.exec("open('/home/user/page.txt', 'w').write('the copy\\n')")
            assert await host_get(its.url + "/page.txt") == b"the copy\n"
            assert await host_get(mine.url + "/page.txt") == b"served by the guest\n"
            out = await copy.exec(
                f"import subprocess; print(subprocess.run({FETCH.split()!r}, "
                "capture_output=True, text=True).stdout, end='')"
            )
            assert out.stdout == "hello from the host's loopback\n", out.stderr
            assert any(e.name == "web.test" for e in copy.network_log)
