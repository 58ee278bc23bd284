"""`sbx mcp` ends with its client: at stdin's EOF, and on SIGTERM, it closes the sessions left
open and exits 0 with no QEMU left behind. The test speaks newline-delimited JSON-RPC itself
(the MCP stdio framing) because it needs the process: the SDK's stdio_client keeps it, and
would kill it after two seconds, hiding a server that does not exit by itself."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import qemu_processes
from tests.integration.mcp.conftest import SBX_MCP, SMALL, server_env

pytestmark = pytest.mark.vm

EXIT_SECONDS = 30.0


class RawClient:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._next_id = 0

    async def send(self, method: str, params: dict[str, Any] | None = None) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._write(message)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        await self._write(
            {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        )
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
            assert line, "the server closed stdout before answering"
            answer = json.loads(line)
            if answer.get("id") == self._next_id:
                assert "result" in answer, answer
                return dict(answer["result"])

    async def _write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()


async def _server_with_a_session(tmp_path: Path) -> tuple[RawClient, list[int]]:
    proc = await asyncio.create_subprocess_exec(
        *SBX_MCP,
        *SMALL,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=server_env(tmp_path),
    )
    client = RawClient(proc)
    await client.request(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    )
    await client.send("notifications/initialized")
    result = await client.request(
        "tools/call", {"name": "open_session", "arguments": {"language": "raw"}}
    )
    assert result.get("isError") is not True, result
    qemus = qemu_processes(parent=proc.pid)
    assert len(qemus) == 1, "the session's VM is a child of the server"
    return client, qemus


async def _exits_cleanly(client: RawClient, qemus: list[int]) -> None:
    returncode = await asyncio.wait_for(client.proc.wait(), EXIT_SECONDS)
    assert returncode == 0
    assert not [pid for pid in qemus if Path(f"/proc/{pid}").exists()], "QEMU outlived sbx mcp"


async def test_stdin_eof_closes_the_sessions_and_exits(tmp_path: Path) -> None:
    client, qemus = await _server_with_a_session(tmp_path)
    assert client.proc.stdin is not None
    client.proc.stdin.close()
    await _exits_cleanly(client, qemus)


async def test_sigterm_closes_the_sessions_and_exits(tmp_path: Path) -> None:
    client, qemus = await _server_with_a_session(tmp_path)
    client.proc.send_signal(signal.SIGTERM)
    try:
        await _exits_cleanly(client, qemus)
    finally:
        assert client.proc.stdin is not None
        client.proc.stdin.close()
