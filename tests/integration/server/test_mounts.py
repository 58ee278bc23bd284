"""An app mounted beside the routes (serve(mounts=...), how the MCP endpoint joins the server):
made on the server's Scheduler, behind the same authentication, with the caller in
request.state.principal; left before the server stops."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from exec_sandbox import Scheduler
from exec_sandbox.server.serve import ServeOptions, serve
from exec_sandbox.server.tokens import TokenStore
from tests.helpers import private_config

pytestmark = pytest.mark.vm


async def test_mounted_app_gets_the_principal_and_the_scheduler(tmp_path: Path) -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def mounted(scheduler: Scheduler) -> AsyncIterator[ASGIApp]:
        events.append(f"enter {scheduler.accelerator}")

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            who = Request(scope).state.principal.name
            await PlainTextResponse(who)(scope, receive, send)

        yield app
        events.append("exit")

    sock = tmp_path / "s.sock"
    lines: list[str] = []
    options = ServeOptions(socket_path=sock, port=0)
    server = asyncio.ensure_future(
        serve(options, private_config(tmp_path), tmp_path / "state", lines.append, {"/x": mounted})
    )
    try:
        while len(lines) < 2:
            assert not server.done(), server.exception()
            await asyncio.sleep(0.05)
        port = int(lines[1].rsplit(":", 1)[1])
        token = TokenStore(tmp_path / "state").create("mcp-user")
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://sbx") as local:
            assert (await local.get("/x/")).text == "local"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as tcp:
            assert (await tcp.get("/x/")).status_code == 401
            answer = await tcp.get("/x/", headers={"Authorization": f"Bearer {token}"})
            assert answer.text == "mcp-user"
    finally:
        if not server.done():  # else no handler of serve() would take the signal
            os.kill(os.getpid(), signal.SIGTERM)  # serve()'s own handler: the orderly stop
        await asyncio.wait_for(server, 60)
    assert events[0].startswith("enter ") and events[1:] == ["exit"]
    assert not sock.exists()
