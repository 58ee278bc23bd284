"""Who a request comes from: the ASGI middleware in front of the server's routes (and of an app
mounted beside them, such as MCP's), which puts the Principal in `scope["state"]["principal"]`
(`request.state.principal`) or answers 401 itself.

The Unix socket's file mode is its authentication (docs/server.md, "Security model"): every
request on it is `local`, with every scope. On TCP each request and WebSocket handshake needs
`Authorization: Bearer TOKEN`, except the public paths (health, the OpenAPI document)."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from .. import wire
from .tokens import LOCAL_PRINCIPAL, Principal, TokenStore, principal_of

PUBLIC_PATHS = frozenset({f"{wire.API_PREFIX}/health", "/openapi.json"})


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
        await self.app(scope, receive, send)

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
