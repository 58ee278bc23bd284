"""`sbx serve`'s MCP endpoint (/mcp, streamable HTTP) in a real server with real VMs: behind the
server's authentication (no token, no MCP), a sandbox session belongs to the caller that opened
it even when another caller claims that caller's name in the header the server sets, and each
caller's session cap is its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from exec_sandbox import wire
from tests.integration.mcp.conftest import call, text_of

from .support import Server, running

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("serve-mcp"), "--mcp-max-sessions", "1") as srv:
        yield srv


@contextlib.asynccontextmanager
async def _client(server: Server, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    url = f"http://127.0.0.1:{server.port}/mcp/"
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


async def test_mcp_needs_a_token(mcp_server: Server) -> None:
    async with httpx2.AsyncClient() as http:
        answer = await http.post(
            f"http://127.0.0.1:{mcp_server.port}/mcp/",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == wire.UNAUTHORIZED


async def test_sessions_belong_to_the_caller_and_caps_are_per_caller(
    mcp_server: Server, tmp_path: Path
) -> None:
    alice = mcp_server.token("mcp-alice")
    mallory = mcp_server.token("mcp-mallory")
    async with _client(mcp_server, _bearer(alice)) as session:
        opened = await call(session, "open_session", language="python")
        assert opened.is_error is False, text_of(opened)
        sid = text_of(opened).splitlines()[0].removeprefix("session_id: ")
        assert "42" in text_of(await call(session, "exec", session_id=sid, code="print(6 * 7)"))
        # Alice's cap (1) is reached: her second session is refused...
        second = await call(session, "open_session", language="raw")
        assert second.is_error is True and "vm_capacity" in text_of(second)
        # ...and Mallory, naming herself Alice in the header the server sets, still has her own
        # cap (a session of her own opens) and does not see or reach Alice's session.
        spoofed = _bearer(mallory, **{wire.PRINCIPAL_HEADER: "mcp-alice"})
        async with _client(mcp_server, spoofed) as other:
            mine = await call(other, "open_session", language="raw")
            assert mine.is_error is False, text_of(mine)
            listed = text_of(await call(other, "list_sessions"))
            own_id = text_of(mine).splitlines()[0].removeprefix("session_id: ")
            assert sid not in listed and own_id in listed
            foreign = await call(other, "exec", session_id=sid, code="print(1)")
            assert foreign.is_error is True and text_of(foreign).startswith("not_found:")
            own = await call(other, "run_code", code="echo mine", language="raw")
            assert "mine" in text_of(own), text_of(own)
        closed = await call(session, "close_session", session_id=sid)
        assert closed.is_error is False, text_of(closed)
