"""The QMP client (qmp.py) against a scripted peer on a socketpair: the framing and bounds of
what it accepts from QEMU. (QEMU itself is exercised by the snapshot tests in real VMs.)"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator

import pytest

from exec_sandbox.vm.qmp import QmpClient, QmpError

GREETING = b'{"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}\r\n'


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


async def _serve(peer: socket.socket, replies: list[bytes]) -> list[dict[str, object]]:
    """Answer each command line with the next reply; return the commands received."""
    loop = asyncio.get_running_loop()
    peer.setblocking(False)
    await loop.sock_sendall(peer, GREETING)
    got: list[dict[str, object]] = []
    buf = b""
    for reply in replies:
        while b"\n" not in buf:
            buf += await loop.sock_recv(peer, 4096)
        line, buf = buf.split(b"\n", 1)
        got.append(json.loads(line))
        await loop.sock_sendall(peer, reply)
    return got


async def test_commands_replies_and_events(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, peer = pair
    server = asyncio.create_task(
        _serve(
            peer,
            [
                b'{"return": {}}\r\n',
                b'{"event": "STOP", "timestamp": {}}\r\n{"return": {"status": "completed"}}\r\n',
                b'{"error": {"class": "GenericError", "desc": "no such thing"}}\r\n',
            ],
        )
    )
    client = await QmpClient.connect(ours.fileno(), timeout=5)
    assert await client.execute("query-migrate") == {"status": "completed"}
    with pytest.raises(QmpError, match="no such thing"):
        await client.execute("bogus", {"x": 1})
    sent = await server
    assert sent == [
        {"execute": "qmp_capabilities"},
        {"execute": "query-migrate"},
        {"execute": "bogus", "arguments": {"x": 1}},
    ]
    client.close()
    assert ours.fileno() >= 0  # the fd stays its owner's


async def test_getfd_passes_the_descriptor(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, peer = pair
    loop = asyncio.get_running_loop()
    peer.setblocking(False)
    await loop.sock_sendall(peer, GREETING)
    client_task = asyncio.create_task(QmpClient.connect(ours.fileno(), timeout=5))
    await asyncio.sleep(0.05)
    peer.recv(4096)
    await loop.sock_sendall(peer, b'{"return": {}}\n')
    client = await client_task
    r, w = os.pipe()
    try:
        call = asyncio.create_task(client.execute("getfd", {"fdname": "x"}, fds=[w]))
        await asyncio.sleep(0.05)
        peer.setblocking(True)
        msg, fds, _, _ = socket.recv_fds(peer, 4096, 1)
        assert json.loads(msg)["execute"] == "getfd" and len(fds) == 1
        os.write(fds[0], b"ok")
        os.close(fds[0])
        assert os.read(r, 2) == b"ok"
        peer.sendall(b'{"return": {}}\n')
        await call
    finally:
        os.close(r)
        os.close(w)
        client.close()


@pytest.mark.parametrize(
    "reply,match",
    [
        (b"x" * (70 * 1024), "over-long"),
        (b"not json\n", "invalid QMP JSON"),
        (b"[1, 2]\n", "not an object"),
        (b'{"neither": 1}\n', "unexpected QMP message"),
        (b"", "closed"),
    ],
)
async def test_hostile_or_broken_replies_raise(
    pair: tuple[socket.socket, socket.socket], reply: bytes, match: str
) -> None:
    ours, peer = pair
    server = asyncio.create_task(_serve(peer, [b'{"return": {}}\n']))
    client = await QmpClient.connect(ours.fileno(), timeout=5)
    await server
    if reply:
        peer.sendall(reply)
    else:
        peer.shutdown(socket.SHUT_WR)
    with pytest.raises(QmpError, match=match):
        await client.execute("query-status", timeout=5)
    # Broken for good: the next command fails at once.
    with pytest.raises(QmpError):
        await client.execute("query-status", timeout=5)
    client.close()


async def test_a_command_cut_short_breaks_the_client(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # QEMU answers the first command late: had the client gone on, that late reply would have
    # been read as the answer to the second command.
    ours, peer = pair
    loop = asyncio.get_running_loop()
    peer.setblocking(False)

    async def serve() -> None:
        await loop.sock_sendall(peer, GREETING)
        await loop.sock_recv(peer, 4096)  # qmp_capabilities
        await loop.sock_sendall(peer, b'{"return": {}}\r\n')
        await loop.sock_recv(peer, 4096)  # the slow command
        await asyncio.sleep(0.3)
        await loop.sock_sendall(peer, b'{"return": {"status": "late"}}\r\n')

    server = asyncio.create_task(serve())
    client = await QmpClient.connect(ours.fileno(), timeout=5)
    with pytest.raises(asyncio.TimeoutError):
        await client.execute("query-migrate", timeout=0.1)
    await server
    with pytest.raises(QmpError, match="out of step"):
        await client.execute("query-status")
    client.close()
