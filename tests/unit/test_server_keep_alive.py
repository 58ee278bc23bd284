"""An idle connection on the Unix socket outlives uvicorn's and httpx's 5 s defaults: a client
whose calls come seconds apart (an agent, a model thinking between tool calls) reuses its
connection instead of connecting for each call. No VM: `sbx serve`'s listener (serve._server)
in front of a one-route ASGI stand-in, and the remote client's Connection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from exec_sandbox.remote._connection import Connection, Endpoint
from exec_sandbox.server.serve import UNIX_KEEP_ALIVE_SECONDS, ServeOptions, _server, bind_unix

IDLE_SECONDS = 6.0  # past both libraries' default of 5 s


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b"{}"
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def test_an_idle_socket_connection_is_reused_after_six_seconds(tmp_path: Path) -> None:
    path = tmp_path / "run" / "sbx.sock"
    sock = bind_unix(path)
    options = ServeOptions(socket_path=path, port=None)
    server = _server(_answer, options, tls=False, keep_alive=UNIX_KEEP_ALIVE_SECONDS)
    await server.startup(sockets=[sock])
    conn = Connection(Endpoint.parse(path), None)
    try:
        assert await conn.call("GET", "/v1/health") == {}
        idle = conn._client._transport._idle  # type: ignore[attr-defined]
        (first,) = idle
        await asyncio.sleep(IDLE_SECONDS)
        assert await conn.call("GET", "/v1/health") == {}
        # The same connection served both: neither side closed it while idle (a closed one
        # is dropped from the pool and the call connects anew).
        assert idle == [first]
        assert len(server.server_state.connections) == 1
    finally:
        await conn.aclose()
        await server.shutdown(sockets=[sock])
        sock.close()
