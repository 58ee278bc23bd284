"""Who a request comes from: the ASGI middleware in front of the server's routes (and of an app
mounted beside them, such as MCP's), which puts the Principal in `scope["state"]["principal"]`
(`request.state.principal`) or answers 401 itself.

The Unix socket's file mode is its authentication (docs/server.md, "Security model"): every
request on it is `local`, with every scope. On TCP each request and WebSocket handshake needs
`Authorization: Bearer TOKEN`, except the public paths (health, the OpenAPI document).

A WebSocket lives longer than its handshake: while it is open its token is checked again every
WATCH_SECONDS (a stat of the token file, a re-read only when it changed), and once the token is
revoked or expired the socket is closed with 1008 (policy violation). Its handler then sees the
client leave, and ends as for a client that went away (a terminal hangs up, a run is cancelled,
a session's exec runs on with its output dropped)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import wire
from .tokens import LOCAL_PRINCIPAL, Principal, TokenStore, principal_of

PUBLIC_PATHS = frozenset({f"{wire.API_PREFIX}/health", "/openapi.json"})
# How often an open WebSocket's token is checked again (revocation closes it within this).
WATCH_SECONDS = 0.5


class Authenticate:
    """tokens None: the Unix socket (everyone is `local`); else bearer tokens of that store."""

    def __init__(self, app: ASGIApp, tokens: TokenStore | None) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if self.tokens is None:
            state["principal"] = LOCAL_PRINCIPAL
        elif scope["path"] not in PUBLIC_PATHS:
            principal, why = self._check(scope)
            if principal is None:
                await _refuse(scope, send, why)
                return
            state["principal"] = principal
            if scope["type"] == "websocket" and principal.sha256 is not None:
                await self._watched(scope, receive, send, principal.sha256)
                return
        await self.app(scope, receive, send)

    async def _watched(self, scope: Scope, receive: Receive, send: Send, sha256: str) -> None:
        """The app on a WebSocket that is closed (1008) once its token is no longer valid: the
        app's next receive() then answers a disconnect, and what it sends is dropped."""
        assert self.tokens is not None
        tokens = self.tokens
        revoked = asyncio.Event()
        closed = False

        async def watch() -> None:
            while True:
                await asyncio.sleep(WATCH_SECONDS)
                try:
                    valid = tokens.still_valid(sha256)
                except (OSError, ValueError):
                    valid = False  # as a new request would be refused
                if not valid:
                    # Closed here, whether or not the app is reading at this moment.
                    await close()
                    revoked.set()
                    return

        async def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                with contextlib.suppress(Exception):  # the client may be gone already
                    await send(
                        {
                            "type": "websocket.close",
                            "code": wire.CLOSE_TOKEN_INVALID,
                            "reason": "token revoked or expired",
                        }
                    )

        async def guarded_receive() -> Message:
            if not revoked.is_set():
                message = asyncio.ensure_future(receive())
                stop = asyncio.ensure_future(revoked.wait())
                try:
                    await asyncio.wait({message, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    if not message.done():
                        message.cancel()
                if message.done() and not message.cancelled():
                    return message.result()
            await close()
            return {"type": "websocket.disconnect", "code": wire.CLOSE_TOKEN_INVALID}

        async def guarded_send(message: Message) -> None:
            nonlocal closed
            if closed:
                return
            if message["type"] == "websocket.close":
                closed = True
            await send(message)

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, guarded_receive, guarded_send)
        finally:
            watcher.cancel()

    def _check(self, scope: Scope) -> tuple[Principal | None, str]:
        assert self.tokens is not None
        header = b""
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                header = value
                break
        scheme, _, token = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "this call needs Authorization: Bearer TOKEN"
        try:
            record = self.tokens.lookup(token.strip())
        except (OSError, ValueError):
            return None, "the server cannot read its tokens"
        if record is None:
            return None, "unknown token"
        if record.expired(time.time()):
            return None, f"token {record.name!r} expired"
        return principal_of(record), ""


async def _refuse(scope: Scope, send: Send, message: str) -> None:
    body = json.dumps(wire.error_body(wire.UNAUTHORIZED, message), separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer"),
    ]
    status = wire.error_status(wire.UNAUTHORIZED)
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    # A WebSocket handshake: answered with an HTTP 401 where the server supports that (the ASGI
    # denial-response extension), else refused with a close before accept (HTTP 403).
    extensions: dict[str, Any] = scope.get("extensions") or {}
    if "websocket.http.response" in extensions:
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
