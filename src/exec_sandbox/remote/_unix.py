"""HTTP/1.1 to `sbx serve` on its Unix socket: an httpx transport that speaks h11 over asyncio's
own Unix streams, with a small pool of kept-alive connections.

httpx's default transport (httpcore, with its anyio backend and its general pool) costs the
client about 1.3 ms per call on this path, more than the server's own work and the hop between
the processes together (docs/benchmarks.md, "The server"): a local socket needs no TLS, proxy,
HTTP/2 or connection racing. The same h11 state machine that httpcore drives parses the answer,
so what the server sends is checked as strictly as before; the httpx client above it (requests,
streaming, errors) is unchanged. TCP keeps httpx's transport."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import h11
import httpx

# An answer's head (status line and headers): the server's are a few hundred bytes.
_MAX_HEAD_BYTES = 64 * 1024
_READ_BYTES = 64 * 1024


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD_BYTES)
        self.idle_since = 0.0

    def unusable(self) -> bool:
        """Closed by the server (or broken) while it sat in the pool, or sent bytes nobody
        asked for: they would be read as the next request's answer."""
        # StreamReader has no public count of what it holds; its buffer is the only place.
        unasked = len(getattr(self.reader, "_buffer", b""))
        return self.writer.is_closing() or self.reader.at_eof() or unasked > 0

    async def send(self, request: httpx.Request, write_timeout: float | None) -> None:
        """The request, its body streamed if it is an iterator. write_timeout bounds each wait
        for the server to take bytes (httpx's meaning), not the whole upload: a large file
        sent at a steady pace takes as long as it takes."""
        start = h11.Request(
            method=request.method, target=request.url.raw_path, headers=request.headers.raw
        )
        head = self.h11.send(start) or b""
        stream = request.stream
        if isinstance(stream, httpx.ByteStream):  # a body in memory (JSON): one write in all
            body = b"".join(stream)
            data = (self.h11.send(h11.Data(data=body)) or b"") if body else b""
            self.writer.write(head + data + (self.h11.send(h11.EndOfMessage()) or b""))
        else:  # an upload read as it goes
            self.writer.write(head)
            async for chunk in stream:  # type: ignore[union-attr]
                if chunk:
                    self.writer.write(self.h11.send(h11.Data(data=chunk)) or b"")
                    await self._drain(write_timeout)
            self.writer.write(self.h11.send(h11.EndOfMessage()) or b"")
        await self._drain(write_timeout)

    async def _drain(self, timeout: float | None) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self.writer.drain()
        except TimeoutError:
            raise httpx.WriteTimeout("the server stopped reading the request") from None

    async def next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(_READ_BYTES)
            # b"" is the server's EOF: h11 turns it into ConnectionClosed or an error.
            self.h11.receive_data(data)

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """The answer's body as it arrives; at its end the connection goes back to the pool."""

    def __init__(self, transport: UnixSocketTransport, connection: _Connection) -> None:
        self._transport = transport
        self._connection = connection
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while not self._done:
            try:
                event = await connection.next_event()
            except (OSError, h11.ProtocolError) as exc:
                raise httpx.ReadError(f"the server's answer broke off: {exc}") from exc
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
            else:
                raise httpx.RemoteProtocolError(f"the server's answer broke off ({event!r})")

    async def aclose(self) -> None:
        self._transport.release(self._connection, reusable=self._done)


class UnixSocketTransport(httpx.AsyncBaseTransport):
    """Requests over the Unix socket at path; idle connections kept keep_alive seconds."""

    def __init__(self, path: str, *, keep_alive: float, max_idle: int = 20) -> None:
        self._path = path
        self._keep_alive = keep_alive
        self._max_idle = max_idle
        self._idle: list[_Connection] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        connection = self._pooled()
        if connection is None:
            try:
                async with asyncio.timeout(timeouts.get("connect")):
                    connection = await self._connect()
            except TimeoutError:
                raise httpx.ConnectTimeout(f"no connection to {self._path} in time") from None
        try:
            try:
                await connection.send(request, timeouts.get("write"))
            except h11.LocalProtocolError as exc:  # ours: a body that does not fit its length
                raise httpx.LocalProtocolError(str(exc)) from exc
            event = await connection.next_event()
        except BaseException as exc:
            connection.close()
            if isinstance(exc, (OSError, h11.RemoteProtocolError)):
                raise httpx.RemoteProtocolError(f"the server's answer broke off: {exc}") from exc
            raise
        if not isinstance(event, h11.Response):
            connection.close()
            raise httpx.RemoteProtocolError(f"the server answered with {event!r}")
        return httpx.Response(
            event.status_code,
            headers=event.headers.raw_items(),
            stream=_Body(self, connection),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": event.reason},
        )

    def release(self, connection: _Connection, *, reusable: bool) -> None:
        """An answer read (or given up on): the connection is kept for the next request when
        both sides finished their messages and the server did not ask to close it."""
        state = connection.h11
        # Bytes past the answer's end (a server writing beyond its Content-Length) would be
        # the next request's answer: such a connection is closed, not kept.
        clean = state.trailing_data == (b"", False)
        if reusable and clean and state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            if len(self._idle) < self._max_idle:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
                return
        connection.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for connection in idle:
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()

    def _pooled(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()  # the most recent: the least likely to be closed
            if now - connection.idle_since < self._keep_alive and not connection.unusable():
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_unix_connection(self._path, limit=_READ_BYTES)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self._path}: {exc}") from exc
        return _Connection(reader, writer)
