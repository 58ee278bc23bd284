"""`sbx mcp` as an MCP client starts it: a subprocess spoken to over stdio by the official `mcp`
client library, on a small configuration (two VMs at most, no warm pool, cold boots: the
caches of the test's own, so nothing is built behind its back)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp_types import CallToolResult, TextContent

from exec_sandbox.paths import images_dir

SBX_MCP = [sys.executable, "-m", "exec_sandbox.cli.main", "mcp"]
SMALL = ["--max-vms", "2", "--no-memory-snapshots"]

McpClient = Callable[..., AbstractAsyncContextManager[ClientSession]]


def server_env(tmp_path: Path) -> dict[str, str]:
    """The subprocess's environment: this test's images, caches under tmp_path."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
        "EXEC_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "EXEC_SANDBOX_DATA_DIR": str(tmp_path / "data"),
    }


@pytest.fixture
def mcp_client(tmp_path: Path) -> McpClient:
    """mcp_client(*extra_args): an initialized ClientSession of a fresh `sbx mcp` (small=False:
    without the small scheduler's flags, as for --server)."""

    @asynccontextmanager
    async def connect(*extra: str, small: bool = True) -> AsyncIterator[ClientSession]:
        flags = SMALL if small else []
        params = StdioServerParameters(
            command=SBX_MCP[0], args=[*SBX_MCP[1:], *flags, *extra], env=server_env(tmp_path)
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    return connect


def text_of(result: CallToolResult) -> str:
    """The text blocks of a tool result, joined."""
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


async def call(session: ClientSession, tool: str, **arguments: object) -> CallToolResult:
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult), result
    return result
