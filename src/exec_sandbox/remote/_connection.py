"""The one connection of a RemoteScheduler to `sbx serve`: where the server is (a Unix socket or
an http(s) URL), its bearer token, an httpx client for REST and WebSocket connections for
streams. Every answer is checked here: an error body becomes the library's exception of its code
(wire.exception_of), a JSON answer is read up to a bound, a transport failure becomes a
CommunicationError that says whether the request may have reached the server.

docs/server.md is the protocol; this module knows paths only as strings its callers give.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from .. import wire
from ..errors import (
    CommunicationError,
    CommunicationOutcomeUnknownError,
    InputValidationError,
    SandboxError,
)
from ..vm.binding import FILE_SIZE_MAX
from ._unix import UnixSocketTransport

TOKEN_ENV = "EXEC_SANDBOX_TOKEN"
# A JSON answer bigger than this is refused: an ExecutionResult holds at most 1 MB of stdout,
# 100 KB of stderr and its rich outputs (figures), base64'd; a listing is far smaller.
JSON_MAX_BYTES = 64 << 20
# One WebSocket message: an exec's result (as above) or a chunk of output.
WS_MAX_BYTES = JSON_MAX_BYTES
# A file read: the library's own limit per file, plus nothing (the server streams the bytes).
FILE_MAX_BYTES = FILE_SIZE_MAX
_CONNECT_SECONDS = 10.0
# A request body that is not JSON: bytes, or chunks (an upload read from a file as it goes).
Body = bytes | AsyncIterable[bytes]
# Writes and the server's first byte of an answer: a run or exec may take up to a day, so the
# read timeout is off; the server's own timeouts end every call.
_TIMEOUT = httpx.Timeout(connect=_CONNECT_SECONDS, read=None, write=120.0, pool=None)
# An idle connection on the Unix socket is kept this long for the next call (httpx's default is
# 5 s: an agent whose calls come seconds apart reconnected for each). `sbx serve` keeps its side
# open longer (server/serve.py), so the client closes first. TCP keeps httpx's default.
_SOCKET_KEEP_ALIVE_SECONDS = 100.0

# The WebSocket library logs every handshake header at DEBUG, the bearer token included: its
# logger here never goes below INFO, whatever the application's logging asks for.
_WS_LOG = logging.getLogger("exec_sandbox.remote.websocket")
_WS_LOG.setLevel(logging.INFO)


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens: a Unix socket path (no token) or an http(s) base URL."""

    socket_path: str | None
    base_url: str  # "http://localhost" for the socket (the Host header only)

    @classmethod
    def parse(cls, target: str | os.PathLike[str]) -> Endpoint:
        """A path or `unix:///path` -> the socket; `http://host:port` or `https://...` -> TCP.
        InputValidationError for anything else."""
        if isinstance(target, os.PathLike):
            target = os.fspath(target)
        if not isinstance(target, str) or not target.strip():
            raise InputValidationError(
                "RemoteScheduler needs a Unix socket path, unix:///path, or an http(s):// URL"
            )
        if target.startswith("unix://"):
            path = target.removeprefix("unix://")
            if not path.startswith("/"):
                raise InputValidationError(f"unix:// needs an absolute path: {target!r}")
            return cls(path, "http://localhost")
        if "://" in target:
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InputValidationError(
                    f"unsupported server address {target!r}: use a socket path, unix:///path, "
                    "http://host:port or https://host:port"
                )
            if parts.path.rstrip("/") or parts.query or parts.fragment:
                raise InputValidationError(
                    f"give the server's address without a path ({target!r}): the client adds "
                    f"{wire.API_PREFIX}/..."
                )
            return cls(None, f"{parts.scheme}://{parts.netloc}")
        return cls(os.path.abspath(target), "http://localhost")

    @property
    def ws_base(self) -> str:
        return (
            "wss" + self.base_url[5:]
            if self.base_url.startswith("https")
            else ("ws" + self.base_url[4:])
        )

    def __str__(self) -> str:
        return f"unix://{self.socket_path}" if self.socket_path else self.base_url


def path(*parts: str) -> str:
    """The API path of parts, each escaped (ids and names come from callers and the server)."""
    return wire.API_PREFIX + "".join("/" + quote(p, safe="") for p in parts)


class Connection:
    """REST calls and WebSocket streams to one server. Opened by RemoteScheduler.start()."""

    def __init__(self, endpoint: Endpoint, token: str | None) -> None:
        self.endpoint = endpoint
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._headers = headers
        # Answers are read as sent and counted against their limits as they arrive: a
        # compressed one could unpack to any size in one step, before any count (the server
        # never compresses; one that does is refused in _send).
        headers = {**headers, "Accept-Encoding": "identity"}
        # The socket: a lean transport of our own (remote/_unix.py); TCP: httpx's.
        transport: httpx.AsyncBaseTransport = (
            UnixSocketTransport(endpoint.socket_path, keep_alive=_SOCKET_KEEP_ALIVE_SECONDS)
            if endpoint.socket_path
            else httpx.AsyncHTTPTransport()
        )
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=endpoint.base_url,
            headers=headers,
            timeout=_TIMEOUT,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        content: Body | None = None,
        params: Mapping[str, Any] | None = None,
        runs_code: bool = False,
    ) -> Any:
        """One REST call: the decoded JSON answer (None for 204), or the library exception of
        the error. `runs_code`: a request that may have started code; a connection lost after
        it was sent is then CommunicationOutcomeUnknownError (else CommunicationError)."""
        async with self._send(method, url, body, content, params, runs_code) as response:
            if response.status_code == 204:
                return None
            data = await _read(response, JSON_MAX_BYTES, "answer")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise CommunicationError(
                f"{method} {url}: the server's answer is not JSON ({exc})"
            ) from None

    async def download(self, url: str, params: Mapping[str, Any], sink: Any) -> int:
        """GET bytes, handing each chunk to `await sink(chunk)`; at most FILE_MAX_BYTES."""
        total = 0
        async with self._send("GET", url, None, None, params, False) as response:
            try:
                async for chunk in response.aiter_raw():
                    total += len(chunk)
                    if total > FILE_MAX_BYTES:
                        raise CommunicationError(
                            f"the server sent more than {FILE_MAX_BYTES} bytes for one file"
                        )
                    await sink(chunk)
            except httpx.HTTPError as exc:
                raise CommunicationError(f"GET {url}: the download broke off: {exc}") from exc
        return total

    @asynccontextmanager
    async def _send(
        self,
        method: str,
        url: str,
        body: Any,
        content: Body | None,
        params: Mapping[str, Any] | None,
        runs_code: bool,
    ) -> AsyncIterator[httpx.Response]:
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        request = self._client.build_request(
            method,
            url,
            json=body if content is None and body is not None else None,
            content=content,
            params=query or None,
            headers={"Content-Type": "application/octet-stream"} if content is not None else None,
        )
        try:
            response = await self._client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise CommunicationError(f"cannot reach the server at {self.endpoint}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise _lost(method, url, exc, runs_code) from exc
        try:
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise CommunicationError(
                    f"{method} {url}: the server's answer is compressed ({encoding}), "
                    "which this client does not accept"
                )
            if response.status_code >= 400:
                raw = await _read(response, JSON_MAX_BYTES, "error")
                raise wire.exception_of(_json_or_none(raw), response.status_code)
            yield response
        except httpx.HTTPError as exc:
            raise _lost(method, url, exc, runs_code) from exc
        finally:
            await response.aclose()

    async def open_stream(
        self, url: str, query: Mapping[str, Any] | None = None
    ) -> ClientConnection:
        """A WebSocket to url (an API path); the caller closes it. A refused handshake raises
        the library exception of the server's error body."""
        q = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        uri = self.endpoint.ws_base + url + ("?" + urlencode(q) if q else "")
        options: dict[str, Any] = {
            "additional_headers": self._headers or None,
            "max_size": WS_MAX_BYTES,
            "open_timeout": _CONNECT_SECONDS,
            # A long exec may print nothing for minutes: keepalive pings notice a dead server.
            "ping_interval": 20,
            "ping_timeout": 60,
            "compression": None,
            "logger": _WS_LOG,
        }
        try:
            if self.endpoint.socket_path:
                return await websockets.unix_connect(self.endpoint.socket_path, uri, **options)
            return await websockets.connect(uri, **options)
        except websockets.InvalidStatus as exc:
            body = _json_or_none(bytes(exc.response.body or b""))
            raise wire.exception_of(body, exc.response.status_code) from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise CommunicationError(f"cannot reach the server at {self.endpoint}: {exc}") from exc

    @asynccontextmanager
    async def stream(
        self, url: str, query: Mapping[str, Any] | None = None
    ) -> AsyncIterator[ClientConnection]:
        """open_stream() as a context: the WebSocket is closed on exit."""
        ws = await self.open_stream(url, query)
        try:
            yield ws
        finally:
            await ws.close()


async def receive_json(ws: ClientConnection, what: str) -> dict[str, Any]:
    """The next message of a stream as a JSON object; CommunicationError for anything else."""
    message = await ws.recv()
    if not isinstance(message, str):
        raise CommunicationError(f"{what}: the server sent a binary message where JSON was due")
    return json_object(message, what)


def json_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise CommunicationError(f"{what}: the server sent a message that is not a JSON object")
    return value


def decoded(cls: type[Any], data: Any, what: str) -> Any:
    """wire.decode, with a server answer of another shape as a CommunicationError."""
    try:
        return wire.decode(cls, data)
    except (TypeError, ValueError, KeyError) as exc:
        raise CommunicationError(
            f"{what}: the server's answer is not a {cls.__name__}: {exc}"
        ) from None


def closed_by_server(exc: ConnectionClosed, what: str) -> Exception | None:
    """The library exception for a stream the server closed for its token (revoked or expired
    while it was open): `unauthorized`, as the next request would be answered. None for any
    other close, which the caller words for its stream."""
    received = exc.rcvd
    if received is None or received.code != wire.CLOSE_TOKEN_INVALID:
        return None
    reason = received.reason or "the token was revoked or has expired"
    return wire.exception_of(
        {"error": {"code": wire.UNAUTHORIZED, "message": f"{what}: {reason}"}}, 401
    )


def error_of(message: Mapping[str, Any]) -> Exception:
    """The library exception of a stream's `{"type": "error", "error": {...}}` message."""
    return wire.exception_of(message)


def _lost(method: str, url: str, exc: Exception, runs_code: bool) -> SandboxError:
    text = f"{method} {url}: the connection to the server broke off ({type(exc).__name__}: {exc})"
    if runs_code:
        return CommunicationOutcomeUnknownError(text + ": the code may have run")
    return CommunicationError(text)


async def _read(response: httpx.Response, limit: int, what: str) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if size > limit:
            raise CommunicationError(f"the server's {what} is larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
