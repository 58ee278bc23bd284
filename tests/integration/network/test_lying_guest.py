"""A guest that owns its kernel can write anything on its network port. User code runs as uid
1000 and cannot open the port, so these tests inject the frames on the host side, exactly where
the port's bytes enter the relay (NetRing.ingest, a test hook), next to a real VM and its real
agent. Refusals must hold; floods and overruns must cost the guest its VM and nothing else."""

from __future__ import annotations

import asyncio
import struct

import pytest

from exec_sandbox import Scheduler, SessionClosedError
from exec_sandbox.errors import CommunicationError
from exec_sandbox.session import Session

pytestmark = pytest.mark.vm

OPEN, DATA = 48, 120


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IBBHI", len(payload), kind, 0, 0, stream) + payload


def open_frame(stream: int, name: str, port: int) -> bytes:
    return frame(OPEN, stream, struct.pack("<II", port, len(name)) + name.encode())


def inject(session: Session, data: bytes) -> None:
    network = session.vm.network
    assert network is not None
    for at in range(0, len(data), 65536 + 12):
        network.inject_from_guest(data[at : at + 65536 + 12])


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_open_for_refused_names_is_refused_and_the_vm_lives(net_scheduler: Scheduler) -> None:
    async with await net_scheduler.session(
        allow_network=True, allowed_domains=["web.test", "localhost"]
    ) as session:
        lies = [
            ("evil.example", 443),
            ("169.254.169.254", 80),
            ("localhost", 80),
            ("web.test", 22),
            ("2130706433", 80),
        ]
        for i, (name, port) in enumerate(lies):
            inject(session, open_frame(0x7FFFFF00 + i, name, port))
        await wait_for(lambda: len(session.network_log) >= len(lies))
        log = {e.name: e for e in session.network_log}
        assert not any(e.allowed for e in log.values()), log
        assert "not in allowed_domains" in log["evil.example"].reason
        assert "IP address" in log["169.254.169.254"].reason
        assert "loopback" in log["localhost"].reason and log["localhost"].addresses
        assert "port 22" in log["web.test"].reason
        assert "IP address" in log["2130706433"].reason
        result = await session.exec("print('still here')")
        assert result.stdout == "still here\n"


@pytest.mark.parametrize(
    "flood",
    [
        pytest.param(b"".join(open_frame(i, "web.test", 80) for i in range(1, 66)), id="streams"),
        pytest.param(
            open_frame(9, "web.test", 80)  # one byte past the window (1 MiB)
            + b"".join(frame(DATA, 9, b"x" * 61440) for _ in range(17))
            + frame(DATA, 9, b"x" * (1024 * 1024 - 17 * 61440 + 1)),
            id="window",
        ),
        pytest.param(frame(DATA, 12345, b"no such stream"), id="unknown-stream"),
        pytest.param(struct.pack("<IBBHI", 10 << 20, DATA, 0, 0, 1), id="oversized-frame"),
    ],
)
async def test_protocol_violations_cost_the_guest_its_vm_only(
    net_scheduler: Scheduler, flood: bytes
) -> None:
    bystander = await net_scheduler.session(allow_network=True, allowed_domains=["web.test"])
    victim = await net_scheduler.session(allow_network=True, allowed_domains=["web.test"])
    try:
        inject(victim, flood)
        await wait_for(lambda: not victim.vm.alive)
        with pytest.raises((SessionClosedError, CommunicationError)):
            await victim.exec("print(1)")
        code = "import urllib.request\nprint(urllib.request.urlopen('http://web.test/hello', timeout=20).status)"  # noqa: E501
        result = await bystander.exec(code)
        assert result.stdout == "200\n", result.stderr
    finally:
        await victim.close()
        await bystander.close()


HOLD_SERVER_PY = (
    "import socket, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import socket, time\\n"
    's = socket.create_server(("127.0.0.1", 8000))\\nkept = []\\n'
    "while True: kept.append(s.accept())'])\n"  # accepts and holds, never answers
    "for _ in range(200):\n"
    "    try:\n"
    "        socket.create_connection(('127.0.0.1', 8000), 1).close(); break\n"
    "    except OSError: time.sleep(0.05)\n"
)


async def test_open_into_a_full_stream_table_is_logged_as_refused(net_scheduler: Scheduler) -> None:
    """Streams of both directions share the VM's table of SBX_NET_STREAMS_MAX (64). When it is
    full, the C relay answers a guest's OPEN itself with TOO_MANY; that attempt must still reach
    the connection log. The real agent counts the same table and resets a 65th connection of user
    code in the guest before asking; the host's refusal is for an OPEN that crosses host streams
    in flight, a race, so the OPENs are injected here to make it certain. One real inbound
    connection (held open by a server in the guest) is the host stream."""
    async with await net_scheduler.session(
        allow_network=True, allowed_domains=["web.test"], expose_ports=[8000]
    ) as session:
        assert (await session.exec(HOLD_SERVER_PY)).exit_code == 0
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", session.exposed_ports[0].external
        )
        try:
            await wait_for(
                lambda: any(e.direction == "inbound" and e.allowed for e in session.network_log)
            )
            # 63 guest streams fill the table (nothing awaits in between: none is decided yet).
            for i in range(63):
                inject(session, open_frame(0x7FFFFE00 + i, "filler.example", 80))
            inject(session, open_frame(0x7FFFFF80, "web.test", 443))
            await wait_for(
                lambda: sum(e.direction == "outbound" for e in session.network_log) >= 64
            )
            (crowded,) = [e for e in session.network_log if e.name == "web.test"]
            assert (crowded.direction, crowded.port, crowded.allowed) == ("outbound", 443, False)
            assert "most streams open" in crowded.reason
            assert (await session.exec("print('still here')")).stdout == "still here\n"
        finally:
            writer.close()


def refused_frame(what: int, port: int, count: int, subject: str) -> bytes:
    return frame(50, 0, struct.pack("<IIII", what, port, count, len(subject)) + subject.encode())


async def test_a_flood_of_refusal_reports_is_bounded(net_scheduler: Scheduler) -> None:
    """A guest ignoring its own rate limit on NET_REFUSED: the relay lets a burst through and
    counts the rest, told as one entry; the VM lives (a well-formed report is no violation)."""
    async with await net_scheduler.session(allow_network=True) as session:
        inject(session, b"".join(refused_frame(0, 0, 1, f"n{i}.example") for i in range(300)))
        await asyncio.sleep(0.5)
        inject(session, refused_frame(2, 0, 5, ""))
        await wait_for(lambda: any(e.name == "" for e in session.network_log))
        reported = [e for e in session.network_log if e.reported_by_guest]
        assert 64 <= len(reported) < 120, len(reported)
        assert all(not e.allowed and e.direction == "outbound" for e in reported)
        (summary,) = [e for e in reported if e.name == ""]
        dropped = int(summary.reason.split(" ", 1)[0])
        assert dropped + len(reported) - 1 == 300 + 5, summary
        assert (await session.exec("print('alive')")).stdout == "alive\n"
