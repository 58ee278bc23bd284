"""Apps mounted beside the routes (the MCP endpoint at /mcp) learn who calls them the one way an
app that knows nothing of this server can: a request header naming the authenticated caller,
set here after Authenticate and never taken from the client (a client's own header of that name
is dropped, so no caller can pass for another)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from .. import wire

_HEADER = wire.PRINCIPAL_HEADER.encode("ascii")


class WithPrincipal:
    """app behind a header naming scope["state"]["principal"] (Authenticate put it there)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            principal = scope.get("state", {}).get("principal")
            headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != _HEADER]
            if principal is not None:
                headers.append((_HEADER, principal.name.encode("utf-8")))
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)
