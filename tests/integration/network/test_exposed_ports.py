"""expose_ports in real VMs: a server in the guest reached from the host through 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

from exec_sandbox import PortMapping, Scheduler
from exec_sandbox.network import NetworkValidationError

pytestmark = pytest.mark.vm

SERVE_PY = (
    "import subprocess, time, socket\n"
    "subprocess.Popen(['python3', '-m', 'http.server', '8000', '--bind', '127.0.0.1'],\n"
    "                 cwd='/home/user', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        socket.create_connection(('127.0.0.1', 8000), 1).close(); break\n"
    "    except OSError: time.sleep(0.05)\n"
    "open('/home/user/page.txt', 'w').write('served by the guest\\n')\n"
)


async def host_get(url: str) -> bytes:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: urllib.request.urlopen(url, timeout=30).read())


async def test_python_http_server_in_the_guest(net_scheduler: Scheduler) -> None:
    async with await net_scheduler.session(expose_ports=[8000]) as session:
        (exposed,) = session.exposed_ports
        assert (exposed.internal, exposed.host, exposed.protocol) == (8000, "127.0.0.1", "tcp")
        assert exposed.url == f"http://127.0.0.1:{exposed.external}"
        result = await session.exec(SERVE_PY)
        assert result.exit_code == 0, result.stderr
        assert await host_get(exposed.url + "/page.txt") == b"served by the guest\n"
        for _ in range(100):
            inbound = [e for e in session.network_log if e.direction == "inbound"]
            if inbound and not inbound[0].still_open:
                break
            await asyncio.sleep(0.05)
        (entry,) = inbound
        assert entry.allowed and entry.port == 8000 and entry.bytes_received > 0


async def test_node_server_in_the_guest(net_scheduler: Scheduler) -> None:
    async with await net_scheduler.session(
        language="javascript", expose_ports=[PortMapping(3000)]
    ) as session:
        result = await session.exec(
            "const http = require('http');"
            "globalThis.srv = http.createServer((q, r) => r.end('node says hi')).listen(3000, '127.0.0.1');"  # noqa: E501
            "await new Promise(r => srv.on('listening', r));"
        )
        assert result.exit_code == 0, result.stderr
        assert await host_get(session.exposed_ports[0].url) == b"node says hi"


async def test_connection_before_the_server_listens_is_closed_cleanly(
    net_scheduler: Scheduler,
) -> None:
    async with await net_scheduler.session(expose_ports=[8000]) as session:
        exposed = session.exposed_ports[0]
        reader, writer = await asyncio.open_connection("127.0.0.1", exposed.external)
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        try:
            data = await asyncio.wait_for(reader.read(), 30)
        except ConnectionResetError:
            data = b""
        assert data == b""  # closed: nothing listened in the guest
        writer.close()
        await asyncio.sleep(0.2)
        refused = [e for e in session.network_log if e.direction == "inbound"]
        assert refused and not refused[0].allowed and "nothing accepted" in refused[0].reason
        # The session is fine, and a server started now is reachable.
        await session.exec(SERVE_PY)
        assert await host_get(exposed.url + "/page.txt") == b"served by the guest\n"


async def test_listener_is_loopback_only_and_freed_by_close(net_scheduler: Scheduler) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        wanted = probe.getsockname()[1]
    session = await net_scheduler.session(expose_ports=[PortMapping(8000, wanted)])
    try:
        assert session.exposed_ports[0].external == wanted
        listening = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
        local = {f[1] for f in listening if f[3] == "0A"}  # LISTEN
        assert f"0100007F:{wanted:04X}" in local  # 127.0.0.1 only
        assert f"00000000:{wanted:04X}" not in local
        # Busy: a second session cannot take the same host port, and says why.
        with pytest.raises(NetworkValidationError, match="already in use"):
            await net_scheduler.session(expose_ports=[PortMapping(8001, wanted)])
    finally:
        await session.close()
    with socket.socket() as again:
        again.bind(("127.0.0.1", wanted))  # free again after close()
