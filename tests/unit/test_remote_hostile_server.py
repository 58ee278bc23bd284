"""The Python client against a server that does not play by the protocol: a scripted stand-in
(an asyncio Unix-socket server that answers canned bytes, not `sbx serve`) sends what a hostile
or broken server could, and the client must refuse it within its bounds."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from exec_sandbox import CommunicationError
from exec_sandbox.remote._connection import JSON_MAX_BYTES, Connection, Endpoint


class StandIn:
    """Answers every request with `answer`; keeps what each request's head said."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.heads: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(self.answer)
            await writer.drain()
        finally:
            writer.close()


Start = Callable[[bytes], Awaitable[tuple[StandIn, Connection]]]


@pytest.fixture
async def connect(tmp_path: Path) -> AsyncIterator[Start]:
    opened: list[tuple[asyncio.Server, Connection]] = []

    async def start(answer: bytes) -> tuple[StandIn, Connection]:
        stand_in = StandIn(answer)
        path = tmp_path / f"s{len(opened)}.sock"
        server = await asyncio.start_unix_server(stand_in.serve, path=str(path))
        connection = Connection(Endpoint.parse(path), None)
        opened.append((server, connection))
        return stand_in, connection

    yield start
    for server, connection in opened:
        await connection.aclose()
        server.close()
        await server.wait_closed()


async def test_a_compressed_answer_is_refused_before_it_is_unpacked(connect: Start) -> None:
    # 1 GB of zeros in ~1 MB: unpacked in one step it would pass the JSON limit many times.
    bomb = gzip.compress(b"0" * (JSON_MAX_BYTES * 16), compresslevel=9)
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(bomb)}\r\n\r\n"
    ).encode()
    stand_in, connection = await connect(head + bomb)
    with pytest.raises(CommunicationError, match="compressed"):
        await connection.call("GET", "/v1/info")
    assert b"accept-encoding: identity" in stand_in.heads[0].lower()


async def test_an_answer_over_the_limit_is_refused(connect: Start) -> None:
    body = b" " * (JSON_MAX_BYTES + 1)
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    _, connection = await connect(head + body)
    with pytest.raises(CommunicationError, match="larger than"):
        await connection.call("GET", "/v1/info")
