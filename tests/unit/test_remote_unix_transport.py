"""RemoteScheduler's transport on the Unix socket (remote/_unix.py) against a scripted STAND-IN
server (asyncio, h11 on the server side; not `sbx serve`, which the contract tests use): kept-alive
connections are reused, one the server closed while idle (or that sent bytes past its answer)
is replaced without an error, a body read from an iterator arrives whole, and an answer cut
short is an error, never a short result."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import h11
import pytest

from exec_sandbox import CommunicationError
from exec_sandbox.remote._connection import Connection, Endpoint


class StandIn:
    def __init__(self) -> None:
        self.connections = 0
        self.bodies: list[bytes] = []
        self.close_after_answer = False
        self.cut_short = False
        self.trailing = b""  # written past each answer's end

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    self.bodies.append(body)
                    answer = json.dumps({"n": len(self.bodies), "size": len(body)}).encode()
                    declared = len(answer) + (100 if self.cut_short else 0)
                    headers = [
                        ("content-type", "application/json"),
                        ("content-length", str(declared)),
                    ]
                    writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
                    writer.write(conn.send(h11.Data(data=answer)) or b"")
                    if self.cut_short:
                        await writer.drain()
                        return
                    writer.write(conn.send(h11.EndOfMessage()) or b"")
                    writer.write(self.trailing)
                    await writer.drain()
                    if self.close_after_answer:
                        return
                    conn.start_next_cycle()
                    body = b""
        finally:
            writer.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[StandIn, Connection]]:
    stand_in = StandIn()
    path = tmp_path / "s.sock"
    server = await asyncio.start_unix_server(stand_in.serve, path=str(path))
    connection = Connection(Endpoint.parse(path), None)
    yield stand_in, connection
    await connection.aclose()
    server.close()
    await server.wait_closed()


async def test_calls_share_one_kept_alive_connection(served: tuple[StandIn, Connection]) -> None:
    stand_in, connection = served
    answers = [await connection.call("POST", "/v1/x", body={"i": i}) for i in range(5)]
    assert [a["n"] for a in answers] == [1, 2, 3, 4, 5]
    assert stand_in.connections == 1


async def test_a_connection_the_server_closed_while_idle_is_replaced(
    served: tuple[StandIn, Connection],
) -> None:
    stand_in, connection = served
    stand_in.close_after_answer = True
    assert (await connection.call("GET", "/v1/x"))["n"] == 1
    await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
    assert (await connection.call("GET", "/v1/x"))["n"] == 2
    assert stand_in.connections == 2


async def test_a_body_read_as_it_goes_arrives_whole(served: tuple[StandIn, Connection]) -> None:
    stand_in, connection = served

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(40):
            yield bytes([i]) * 10_000

    answer = await connection.call("PUT", "/v1/file", content=chunks())
    assert answer["size"] == 400_000
    assert stand_in.bodies[0] == b"".join(bytes([i]) * 10_000 for i in range(40))


async def test_an_answer_cut_short_is_an_error(served: tuple[StandIn, Connection]) -> None:
    stand_in, connection = served
    stand_in.cut_short = True
    with pytest.raises(CommunicationError):
        await connection.call("GET", "/v1/x")


async def test_bytes_past_an_answer_end_its_connection(served: tuple[StandIn, Connection]) -> None:
    stand_in, connection = served
    stand_in.trailing = b'HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{"n": 99}'
    assert (await connection.call("GET", "/v1/x"))["n"] == 1
    # Not the bytes that followed the first answer: a new connection's own answer.
    assert (await connection.call("GET", "/v1/x"))["n"] == 2
    assert stand_in.connections == 2
