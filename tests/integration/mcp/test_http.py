"""The MCP server as a streamable-HTTP ASGI app (`mcp_server.http_app`), mounted at /mcp of a
Starlette app as `sbx serve` mounts it, served by uvicorn on 127.0.0.1 and driven by the SDK's
streamable-HTTP client: the tools run code in real VMs, a session belongs to the MCP connection
that opened it, and the sessions left open are closed when the app stops, while the scheduler
(owned by the host app) lives on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.routing import Mount

from exec_sandbox import Scheduler
from exec_sandbox.mcp_server import http_app
from tests.helpers import private_config, qemu_processes
from tests.integration.mcp.conftest import call, text_of

pytestmark = pytest.mark.vm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _serve(scheduler: Scheduler) -> AsyncIterator[str]:
    """The host app on a loopback port; its URL's /mcp/ is the MCP endpoint."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with http_app(lambda: contextlib.nullcontext(scheduler)) as mcp_app:
            app.router.routes.append(Mount("/mcp", app=mcp_app))
            yield

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(lifespan=lifespan), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not serving.done(), "uvicorn did not start"
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp/"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


async def test_streamable_http_runs_code_and_closes_sessions_at_shutdown(
    tmp_path: Path, images_ready: None
) -> None:
    async with Scheduler(private_config(tmp_path)) as scheduler:
        async with _serve(scheduler) as url:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"run_code", "open_session", "exec"} <= names
                ran = await call(
                    session, "run_code", code="console.log(6 * 7)", language="javascript"
                )
                assert "stdout:\n42" in text_of(ran), text_of(ran)
                opened = await call(session, "open_session", language="raw")
                assert opened.is_error is False, text_of(opened)
                sid = text_of(opened).splitlines()[0].removeprefix("session_id: ")
            # The MCP client went away; the sandbox session is the app's until it stops, and
            # another client neither sees it nor reaches it by its id.
            assert len(qemu_processes(parent=os.getpid())) == 1
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as other,
            ):
                await other.initialize()
                listed = text_of(await call(other, "list_sessions"))
                foreign = await call(other, "exec", session_id=sid, code="echo no")
            assert sid not in listed
            assert foreign.is_error is True and text_of(foreign).startswith("not_found:")
        assert qemu_processes(parent=os.getpid()) == [], "the app's stop closes its sessions"
        # The scheduler was the host app's: still there.
        after = await scheduler.run("echo still", language="raw")
        assert after.stdout == "still\n"
