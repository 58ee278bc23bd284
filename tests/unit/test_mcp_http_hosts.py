"""The MCP HTTP app's default Host/Origin check (mcp_server.serve.LOOPBACK_ONLY): loopback names
with or without a port pass (a Unix socket's client sends "localhost"), any other name is
refused, against DNS rebinding. In process through the ASGI interface; no VM (nothing reaches
a tool)."""

from __future__ import annotations

import contextlib

import httpx2
import pytest

from exec_sandbox.mcp_server import http_app

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.mark.parametrize(
    ("host", "origin", "admitted"),
    [
        ("localhost", None, True),
        ("127.0.0.1:8642", "http://127.0.0.1:8642", True),
        ("[::1]:80", None, True),
        ("rebound.example:8642", None, False),
        ("localhost", "http://rebound.example", False),
    ],
)
async def test_only_loopback_names_are_admitted(
    host: str, origin: str | None, admitted: bool
) -> None:
    headers = {**HEADERS, "host": host, **({"origin": origin} if origin else {})}
    async with http_app(lambda: contextlib.nullcontext(None)) as app:  # type: ignore[arg-type,return-value]
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as client:
            answer = await client.post("/", json=INITIALIZE, headers=headers)
    assert (answer.status_code not in (403, 421)) is admitted, answer.status_code
