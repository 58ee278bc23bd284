"""The hub's orchestration (policy decisions, the log, exposed ports, violations) against a
frame-speaking STAND-IN for the guest agent on a socketpair: no VM here (tests/integration/
network/ has the real ones). The C relay under it is the real one."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from exec_sandbox.models import PortMapping
from exec_sandbox.network.hub import NetworkHub
from exec_sandbox.network.names import parse_allowed_domains
from exec_sandbox.network.policy import NetworkPolicy
from exec_sandbox.network.ports import bind_listeners

OPEN, CONNECTED, OPENED, CONNECT, DATA, CREDIT, SHUTDOWN, CLOSE = (
    48,
    49,
    112,
    113,
    120,
    121,
    122,
    123,
)


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IBBHI", len(payload), kind, 0, 0, stream) + payload


def open_frame(stream: int, name: str, port: int) -> bytes:
    raw = name.encode()
    return frame(OPEN, stream, struct.pack("<II", port, len(raw)) + raw)


class StandInGuest:
    """Speaks the guest side of the net port: sends frames, reads the host's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def recv(self, timeout: float = 5.0) -> tuple[int, int, bytes]:
        loop = asyncio.get_running_loop()
        while True:
            if len(self.buf) >= 12:
                length, kind, _f, _r, stream = struct.unpack_from("<IBBHI", self.buf)
                if len(self.buf) >= 12 + length:
                    payload = self.buf[12 : 12 + length]
                    self.buf = self.buf[12 + length :]
                    return kind, stream, payload
            chunk = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), timeout)
            if not chunk:
                raise EOFError
            self.buf += chunk

    async def recv_kind(self, kind: int) -> tuple[int, bytes]:
        while True:
            got, stream, payload = await self.recv()
            if got == kind:
                return stream, payload


@pytest.fixture
async def hub() -> AsyncIterator[NetworkHub]:
    h = NetworkHub(asyncio.get_running_loop())
    yield h
    h.close()


async def echo_server() -> tuple[asyncio.base_events.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(100)
        writer.write(b"echo:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def pair() -> tuple[socket.socket, StandInGuest]:
    host_end, guest_end = socket.socketpair()
    host_end.setblocking(False)
    guest_end.setblocking(False)
    return host_end, StandInGuest(guest_end)


async def test_allowed_name_is_connected_relayed_and_logged(hub: NetworkHub) -> None:
    server, port = await echo_server()
    policy = NetworkPolicy(
        outbound=True,
        rules=parse_allowed_domains(["svc.test"]),
        test_hosts={"api.svc.test": f"127.0.0.1:{port}"},
    )
    host_end, guest = pair()
    net = hub.attach(host_end.fileno(), policy, on_violation=lambda why: None)
    await guest.send(open_frame(1, "api.svc.test", 443))
    stream, payload = await guest.recv_kind(OPENED)
    assert (stream, struct.unpack_from("<I", payload)[0]) == (1, 0)
    await guest.send(frame(DATA, 1, b"hi") + frame(SHUTDOWN, 1))
    _, data = await guest.recv_kind(DATA)
    assert data == b"echo:hi"
    await guest.recv_kind(CLOSE)
    await guest.send(frame(CLOSE, 1, struct.pack("<I", 0)))
    for _ in range(100):
        if net.log and net.log[0].duration_ms is not None and not net._pending:
            break
        await asyncio.sleep(0.01)
    (entry,) = net.log
    assert (entry.direction, entry.name, entry.port, entry.allowed) == (
        "outbound",
        "api.svc.test",
        443,
        True,
    )
    assert entry.addresses == ("127.0.0.1",)
    assert (entry.bytes_sent, entry.bytes_received) == (2, 7)
    net.close()
    host_end.close()
    guest.sock.close()
    server.close()


@pytest.mark.parametrize(
    "name, port, status, words",
    [
        ("other.test", 443, 1, "not in allowed_domains"),
        ("xsvc.test", 443, 1, "not in allowed_domains"),
        ("svc.test", 22, 1, "port 22"),
        ("127.0.0.1", 80, 1, "IP address"),
    ],
)
async def test_refusals_answer_status_and_reason_and_are_logged(
    hub: NetworkHub, name: str, port: int, status: int, words: str
) -> None:
    policy = NetworkPolicy(outbound=True, rules=parse_allowed_domains(["svc.test"]))
    host_end, guest = pair()
    net = hub.attach(host_end.fileno(), policy, on_violation=lambda why: None)
    await guest.send(open_frame(5, name, port))
    stream, payload = await guest.recv_kind(OPENED)
    got_status, reason_len = struct.unpack_from("<II", payload)
    assert (stream, got_status) == (5, status)
    assert words in payload[8 : 8 + reason_len].decode()
    (entry,) = net.log
    assert not entry.allowed and words in entry.reason
    net.close()
    host_end.close()
    guest.sock.close()


async def test_names_resolving_to_loopback_are_refused_by_address(hub: NetworkHub) -> None:
    # No test hook for "localhost": the host's real resolver answers 127.0.0.1 / ::1.
    policy = NetworkPolicy(outbound=True, rules=None)
    host_end, guest = pair()
    net = hub.attach(host_end.fileno(), policy, on_violation=lambda why: None)
    await guest.send(open_frame(3, "localhost.localdomain", 80))
    await guest.send(open_frame(7, "localhost", 80))
    for _ in (3, 7):
        stream, payload = await guest.recv_kind(OPENED)
        assert struct.unpack_from("<I", payload)[0] in (1, 2, 3), stream
    assert all(not e.allowed for e in net.log)
    net.close()
    host_end.close()
    guest.sock.close()


async def test_a_violation_reaches_the_callback(hub: NetworkHub) -> None:
    seen: list[str] = []
    host_end, guest = pair()
    hub.attach(host_end.fileno(), NetworkPolicy(outbound=True), on_violation=seen.append)
    await guest.send(frame(DATA, 9, b"no such stream"))
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen and "unknown stream" in seen[0]
    host_end.close()
    guest.sock.close()


async def test_exposed_port_connection_becomes_a_connect_stream(hub: NetworkHub) -> None:
    host_end, guest = pair()
    net = hub.attach(host_end.fileno(), NetworkPolicy(outbound=False), on_violation=lambda w: None)
    listeners = bind_listeners([PortMapping(8000)])
    assert listeners[0][0].getsockname()[0] == "127.0.0.1"
    net.serve(listeners)
    exposed = net.exposed[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", exposed.external)
    stream, payload = await guest.recv_kind(CONNECT)
    assert struct.unpack("<I", payload)[0] == 8000 and stream & 0x80000000
    await guest.send(frame(CONNECTED, stream, struct.pack("<I", 0)))
    await guest.send(frame(DATA, stream, b"hello from the guest") + frame(SHUTDOWN, stream))
    assert await asyncio.wait_for(reader.read(), 5) == b"hello from the guest"
    writer.close()
    net.close()
    # The listener is gone with the VM's network.
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", exposed.external)
    host_end.close()
    guest.sock.close()


async def test_busy_host_port_is_a_clear_error() -> None:
    from exec_sandbox.network import NetworkValidationError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with pytest.raises(NetworkValidationError, match="already in use"):
        bind_listeners([PortMapping(80, taken.getsockname()[1])])
    taken.close()


async def test_a_secret_host_without_a_certificate_is_refused_not_left_waiting(
    hub: NetworkHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the host cannot make the interception CA (openssl failing), the guest's OPEN to a
    secret's TLS host gets CONNECT_FAILED with the reason, and the log says why."""
    from exec_sandbox import Secret
    from exec_sandbox.network.request import parse_network_request

    server, port = await echo_server()
    request = parse_network_request(True, ["svc.test"], None, [Secret("K", "v", ["api.svc.test"])])
    assert request is not None
    policy = NetworkPolicy(
        outbound=True, rules=request.rules, test_hosts={"api.svc.test": f"127.0.0.1:{port}"}
    )

    async def broken() -> None:
        raise OSError("openssl: not found")

    monkeypatch.setattr(hub, "intercept_ca", broken)
    host_end, guest = pair()
    net = hub.attach(host_end.fileno(), policy, on_violation=lambda why: None)
    net.request = request.bound()
    await guest.send(open_frame(1, "api.svc.test", 443))
    stream, payload = await guest.recv_kind(OPENED)
    assert (stream, struct.unpack_from("<I", payload)[0]) == (1, 4)  # CONNECT_FAILED
    assert b"could not make a certificate" in payload
    (entry,) = net.log
    assert not entry.allowed and "openssl: not found" in entry.reason
    net.close()
    host_end.close()
    guest.sock.close()
    server.close()
