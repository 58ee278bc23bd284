"""The host side of a connection to a secret's host: the guest's HTTP/1.1 requests are parsed
(h11: pure Python, maintained, memory-safe; every size and wait bounded here), their header
placeholders replaced (secrets.HostSecrets), and re-sent by the host to the real host; responses
(streamed, chunked, keep-alive, a protocol switch such as a WebSocket upgrade) go back as they
come. Port 443 is TLS on both legs: the guest's ends at the scheduler's CA (tls_ca.py), the
host's own is verified with the host's trust store. Any other port is plain HTTP.

The guest is the attacker: whatever it sends ends in a 4xx and a closed connection, never in
unbounded memory or a stuck task. The relay's stream to the guest is one end of a socketpair;
this coroutine owns the other end and the socket to the real host, and closes both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import h11

from ..models import HttpRequestRecord
from .secrets import HostSecrets

log = logging.getLogger(__name__)

HEAD_MAX = 64 * 1024  # a request head (request line and headers), bytes
HEADERS_MAX = 256  # headers in one request head
RESPONSE_HEAD_MAX = 256 * 1024  # a response head from the real host
READ_SIZE = 64 * 1024  # one read: the most body a Data event holds, so the most buffered
HEAD_TIMEOUT_SECONDS = 30.0  # a whole request head must come within this (slowloris)
IDLE_TIMEOUT_SECONDS = 300.0  # no byte either way for this long: the connection is closed
TLS_HANDSHAKE_TIMEOUT_SECONDS = 15.0
LINGER_SECONDS = 2.0  # after a refusal: how long the rest of the guest's request is read
LINGER_BYTES_MAX = 4 << 20
RECORDS_MAX = 1000  # requests logged per connection (the rest are relayed, not logged)
# A body read whole to replace placeholders in it (Secret.replace_in_body): its most bytes.
BODY_REPLACE_MAX = 1 << 20
# A head with the values in it (each may be up to 16 KiB in place of a 43-byte placeholder).
REWRITTEN_HEAD_MAX = 4 * HEAD_MAX
TLS_PORT = 443


class _Refuse(Exception):
    """End the exchange with this status and reason sent to the guest (if it can still be)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class _Record:
    method: str
    path: str
    secrets: tuple[str, ...]
    status: int = 0
    sent: int = 0
    received: int = 0
    error: str = ""

    def freeze(self) -> HttpRequestRecord:
        return HttpRequestRecord(
            self.method, self.path, self.status, self.sent, self.received, self.secrets, self.error
        )


@dataclass
class _Leg:
    """One side's stream and its h11 state machine."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h11.Connection
    closed: bool = field(default=False)

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def next_event(self, deadline: float | None) -> h11.Event:
        """The next event (h11 buffers at most its max_incomplete_event_size plus one read:
        nothing is read while a message waits for its answer, so pipelined requests wait in
        the socket, not here). deadline: for the whole event, else IDLE_TIMEOUT per read."""
        while True:
            event = self.conn.next_event()
            if event is h11.PAUSED:
                raise h11.RemoteProtocolError("a message came when none was expected", 400)
            if event is not h11.NEED_DATA:
                assert isinstance(event, h11.Event)
                return event
            loop = asyncio.get_running_loop()
            when = deadline if deadline is not None else loop.time() + IDLE_TIMEOUT_SECONDS
            async with asyncio.timeout_at(when):
                data = await self.reader.read(READ_SIZE)
            self.conn.receive_data(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


async def _accepted(sock: socket.socket, context: ssl.SSLContext | None, handed: set[int]) -> _Leg:
    loop = asyncio.get_running_loop()
    handed.add(id(sock))
    reader = asyncio.StreamReader(limit=READ_SIZE)
    protocol = asyncio.StreamReaderProtocol(reader)
    kwargs = {} if context is None else {"ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT_SECONDS}
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock, ssl=context, **kwargs)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return _Leg(reader, writer, h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_MAX))


async def _connected(
    sock: socket.socket, name: str, context: ssl.SSLContext | None, handed: set[int]
) -> _Leg:
    handed.add(id(sock))
    if context is None:
        reader, writer = await asyncio.open_connection(sock=sock, limit=READ_SIZE)
    else:
        reader, writer = await asyncio.open_connection(
            sock=sock,
            ssl=context,
            server_hostname=name,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_SECONDS,
            limit=READ_SIZE,
        )
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=RESPONSE_HEAD_MAX)
    return _Leg(reader, writer, conn)


class Interception:
    """One intercepted connection (serve() runs it to the end)."""

    def __init__(
        self,
        name: str,
        port: int,
        rules: HostSecrets,
        on_record: Callable[[HttpRequestRecord], None],
    ) -> None:
        self.name = name
        self.port = port
        self.rules = rules
        self._on_record = on_record
        self._records = 0
        self._guest: _Leg | None = None
        self._upstream: _Leg | None = None
        self._handed: set[int] = set()  # id()s of the sockets given to a transport

    async def serve(
        self,
        guest_sock: socket.socket,
        upstream_sock: socket.socket,
        guest_tls: ssl.SSLContext | None,
        upstream_tls: ssl.SSLContext | None,
    ) -> None:
        """Relay the connection; both sockets are this call's (closed when it returns)."""
        # The real host's handshake runs while the guest's does: its failure (a certificate
        # the host cannot verify) becomes the guest's 502 once a request has come.
        upstream = asyncio.ensure_future(
            _connected(upstream_sock, self.name, upstream_tls, self._handed)
        )
        try:
            try:
                self._guest = await _accepted(guest_sock, guest_tls, self._handed)
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                log.info("intercepted %s:%d: guest TLS: %s", self.name, self.port, exc)
                return
            await self._exchanges(upstream)
        except (OSError, TimeoutError, h11.ProtocolError) as exc:
            log.debug("intercepted %s:%d ended: %r", self.name, self.port, exc)
        finally:
            if not upstream.done():
                upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream
            if upstream.done() and not upstream.cancelled() and upstream.exception() is None:
                self._upstream = upstream.result()  # its transport owns the socket now
            for leg in (self._guest, self._upstream):
                if leg is not None:
                    leg.close()
            # Only a socket no transport took: a transport closes its own, even when it failed
            # to start, and closing it here too could free its number while the transport is
            # still registered with the loop.
            if id(guest_sock) not in self._handed:
                guest_sock.close()
            if id(upstream_sock) not in self._handed:
                upstream_sock.close()

    async def _exchanges(self, upstream: asyncio.Future[_Leg]) -> None:
        guest = self._guest
        assert guest is not None
        loop = asyncio.get_running_loop()
        while True:
            record: _Record | None = None
            try:
                event = await guest.next_event(loop.time() + HEAD_TIMEOUT_SECONDS)
                if isinstance(event, h11.ConnectionClosed):
                    return
                if not isinstance(event, h11.Request):
                    raise _Refuse(400, f"unexpected {type(event).__name__}")
                if len(event.headers) > HEADERS_MAX:
                    raise _Refuse(431, f"more than {HEADERS_MAX} headers")
                if event.method == b"TRACE":  # it echoes the request, values included
                    raise _Refuse(405, "TRACE is not relayed to a secret's host")
                self._check_authority(event)
                self._check_framing(event)
                headers, used = self.rules.rewrite(list(event.headers.raw_items()))
                if sum(len(n) + len(v) for n, v in headers) > REWRITTEN_HEAD_MAX:
                    raise _Refuse(431, "the request head is too large with the values in it")
                body = None
                if self.rules.rewrites_bodies and _has_body(headers):
                    body = await self._whole_body(guest)
                    kind = next((v for n, v in headers if n.lower() == b"content-type"), b"")
                    body = self.rules.rewrite_body(body, kind, used)
                    if len(body) > 2 * BODY_REPLACE_MAX:
                        raise _Refuse(413, "the body is too large with the values in it")
                    headers = _framed(headers, len(body))
                record = _Record(
                    event.method.decode("ascii", "replace")[:32],
                    event.target.decode("ascii", "replace")[:2048],
                    tuple(sorted(used)),
                )
                if body is not None:
                    record.sent = len(body)
                if self._upstream is None:
                    self._upstream = await self._open_upstream(upstream)
                await self._upstream.send(
                    h11.Request(method=event.method, target=event.target, headers=headers)
                )
                switched = await self._exchange(guest, self._upstream, record, body)
            except _Refuse as refuse:
                if record is not None:
                    record.error = refuse.reason
                    record.status = refuse.status
                await self._refuse(guest, refuse)
                return
            except h11.RemoteProtocolError as exc:
                hint = exc.error_status_hint
                if record is not None and record.status == 0:
                    record.error = f"bad request from the guest: {exc}"
                await self._refuse(guest, _Refuse(hint, f"bad request: {exc}"))
                return
            except TimeoutError:
                if record is not None:
                    record.error = "timed out"
                    return
                if not guest.conn.trailing_data[0]:
                    return  # an idle keep-alive connection: closed without a word
                await self._refuse(guest, _Refuse(408, "the request head did not come in time"))
                return
            finally:
                if record is not None:
                    self._record(record)
            if switched:
                await self._pipe(guest, self._upstream)
                return
            if not _reusable(guest.conn) or not _reusable(self._upstream.conn):
                return
            guest.conn.start_next_cycle()
            self._upstream.conn.start_next_cycle()

    def _check_authority(self, request: h11.Request) -> None:
        """The request must be for the host the connection is to. A server behind a shared
        address (a CDN) routes by the Host header: a request for another site there would
        carry the secret to that site."""
        if request.target != b"*" and not request.target.startswith(b"/"):
            raise _Refuse(400, "only origin-form request targets ('/path') are relayed")
        hosts = [v for k, v in request.headers if k == b"host"]
        host = hosts[0].decode("ascii", "replace").lower() if len(hosts) == 1 else ""
        name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
        if name.rstrip(".") != self.name or (port and port != str(self.port)):
            raise _Refuse(421, f"the Host header must name {self.name} (this connection's host)")

    @staticmethod
    def _check_framing(request: h11.Request) -> None:
        """Content-Length beside Transfer-Encoding is refused (RFC 9112 6.3: a request
        smuggling attempt; h11 would pass both on, and a server reading the length would take
        the rest as the start of the next request, the one carrying a value)."""
        names = {n for n, _ in request.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            raise _Refuse(400, "Content-Length and Transfer-Encoding together")

    async def _open_upstream(self, upstream: asyncio.Future[_Leg]) -> _Leg:
        try:
            return await upstream
        except ssl.SSLCertVerificationError as exc:
            raise _Refuse(
                502,
                f"{self.name}: the real host's certificate cannot be verified: "
                f"{exc.verify_message}",
            ) from None
        except (OSError, TimeoutError) as exc:
            raise _Refuse(502, f"{self.name}: cannot reach the real host: {exc}") from None

    async def _whole_body(self, guest: _Leg) -> bytes:
        """A request's body, read before the request goes on (its placeholders are replaced,
        and its length may change): at most BODY_REPLACE_MAX bytes, else 413. A client that
        waits for "100 Continue" gets it from here."""
        if guest.conn.they_are_waiting_for_100_continue:
            await guest.send(h11.InformationalResponse(status_code=100, headers=[]))
        loop = asyncio.get_running_loop()
        parts: list[bytes] = []
        size = 0
        while True:
            event = await guest.next_event(loop.time() + HEAD_TIMEOUT_SECONDS)
            if isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            if not isinstance(event, h11.Data):
                raise _Refuse(400, f"unexpected {type(event).__name__} in a request body")
            size += len(event.data)
            if size > BODY_REPLACE_MAX:
                raise _Refuse(
                    413,
                    f"a body whose secrets are replaced is at most {BODY_REPLACE_MAX} bytes",
                )
            parts.append(event.data)

    async def _exchange(
        self, guest: _Leg, upstream: _Leg, record: _Record, body: bytes | None = None
    ) -> bool:
        """One request's body up and its response down, at the same time (a server may answer
        before the body ends). True when the protocol switched (101). body: the request's whole
        body, already read (and rewritten)."""
        switched = False

        async def request_body() -> None:
            if body is not None:
                if body:
                    await upstream.send(h11.Data(data=body))
                await upstream.send(h11.EndOfMessage())
                return
            while True:
                event = await guest.next_event(None)
                if isinstance(event, h11.Data):
                    record.sent += len(event.data)
                    await upstream.send(event)
                elif isinstance(event, h11.EndOfMessage):
                    await upstream.send(h11.EndOfMessage())  # trailers are not relayed
                    return
                else:
                    raise _Refuse(400, f"unexpected {type(event).__name__} in a request body")

        async def response() -> None:
            nonlocal switched
            while True:
                try:
                    event = await upstream.next_event(None)
                except h11.RemoteProtocolError as exc:
                    raise _Refuse(502, f"{self.name}: bad response: {exc}") from None
                if isinstance(event, h11.InformationalResponse):
                    await guest.send(event)
                    if event.status_code == 101:
                        record.status = 101
                        switched = True
                        return
                elif isinstance(event, h11.Response):
                    record.status = event.status_code
                    await guest.send(
                        h11.Response(
                            status_code=event.status_code,
                            headers=list(event.headers.raw_items()),
                            reason=event.reason,
                        )
                    )
                elif isinstance(event, h11.Data):
                    record.received += len(event.data)
                    await guest.send(event)
                elif isinstance(event, h11.EndOfMessage):
                    await guest.send(h11.EndOfMessage())
                    return
                else:  # ConnectionClosed before the response ended
                    raise _Refuse(502, f"{self.name} closed the connection mid-response")

        # Either side failing ends both at once: a guest that drops its body half-way must not
        # leave the response side waiting for the real host until the idle timeout.
        tasks = (asyncio.ensure_future(request_body()), asyncio.ensure_future(response()))
        try:
            done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                failure = task.exception()
                if failure is not None:
                    raise failure
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
        return switched

    async def _pipe(self, guest: _Leg, upstream: _Leg) -> None:
        """After a protocol switch: bytes both ways until either side ends (idle-bounded)."""

        async def copy(src: _Leg, dst: _Leg, first: bytes) -> None:
            if first:
                dst.writer.write(first)
            while True:
                await dst.writer.drain()
                async with asyncio.timeout(IDLE_TIMEOUT_SECONDS):
                    data = await src.reader.read(READ_SIZE)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.writer.write_eof()
                    return
                dst.writer.write(data)

        up = asyncio.ensure_future(copy(guest, upstream, guest.conn.trailing_data[0]))
        down = asyncio.ensure_future(copy(upstream, guest, upstream.conn.trailing_data[0]))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            await asyncio.gather(up, down)
        finally:
            for task in (up, down):
                task.cancel()

    async def _refuse(self, guest: _Leg, refuse: _Refuse) -> None:
        """Tell the guest why (when a response can still be sent), then end the connection."""
        log.info("intercepted %s:%d: %d %s", self.name, self.port, refuse.status, refuse.reason)
        if guest.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = (refuse.reason + "\n").encode("utf-8", "replace")
        with contextlib.suppress(h11.LocalProtocolError, OSError):
            await guest.send(
                h11.Response(
                    status_code=refuse.status,
                    headers=[
                        ("content-type", "text/plain; charset=utf-8"),
                        ("content-length", str(len(body))),
                        ("connection", "close"),
                    ],
                )
            )
            await guest.send(h11.Data(data=body))
            await guest.send(h11.EndOfMessage())
            await _linger(guest)

    def _record(self, record: _Record) -> None:
        if self._records < RECORDS_MAX:
            self._records += 1
            self._on_record(record.freeze())


async def _linger(guest: _Leg) -> None:
    """Half-close, then read and drop what the guest is still sending (bounded in bytes and
    time): a close with unread bytes would reset the connection, and the guest's client would
    lose the answer saying why."""
    with contextlib.suppress(OSError, RuntimeError, NotImplementedError):
        if guest.writer.can_write_eof():
            guest.writer.write_eof()
    dropped = 0
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(LINGER_SECONDS):
            while dropped < LINGER_BYTES_MAX:
                data = await guest.reader.read(READ_SIZE)
                if not data:
                    return
                dropped += len(data)


def _reusable(conn: h11.Connection) -> bool:
    return conn.our_state is h11.DONE and conn.their_state is h11.DONE


def is_tls_port(port: int) -> bool:
    return port == TLS_PORT


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request with these headers has a body (RFC 9112: Transfer-Encoding or a
    Content-Length other than 0)."""
    for name, value in headers:
        lower = name.lower()
        if lower == b"transfer-encoding":
            return True
        if lower == b"content-length" and value.strip() != b"0":
            return True
    return False


def _framed(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    """headers for a body of length bytes sent whole: its Content-Length, no Transfer-Encoding,
    and no Expect (the 100 Continue was answered here)."""
    drop = (b"content-length", b"transfer-encoding", b"expect")
    kept = [(n, v) for n, v in headers if n.lower() not in drop]
    return [*kept, (b"content-length", str(length).encode())]
