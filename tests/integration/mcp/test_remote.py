"""`sbx mcp --server`: the same tools over a `sbx serve` through RemoteScheduler, started here
on a Unix socket of the test's own. The VMs are the server's: what `sbx mcp` closes at its EOF
is closed on the server too.

Skipped where the package has no `sbx serve` and RemoteScheduler (exec_sandbox.server and
exec_sandbox.remote come from another branch of this work)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.mcp.conftest import SBX_MCP, McpClient, call, server_env, text_of

pytest.importorskip("exec_sandbox.remote", reason="RemoteScheduler is not in this tree yet")
pytest.importorskip("exec_sandbox.server", reason="sbx serve is not in this tree yet")

pytestmark = pytest.mark.vm


@pytest.fixture
def sbx_serve(tmp_path: Path) -> Iterator[Path]:
    """A `sbx serve` on tmp_path/sbx.sock, stopped (SIGTERM, sessions closed) at teardown."""
    socket = tmp_path / "sbx.sock"
    env = {**server_env(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    serve = [*SBX_MCP[:-1], "serve", "--socket", str(socket), "--max-vms", "2"]
    proc = subprocess.Popen(
        [*serve, "--no-memory-snapshots", "--on-shutdown", "close"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            if socket.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert socket.exists(), "sbx serve did not listen"
        yield socket
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _server_sessions(socket: Path) -> list[dict[str, object]]:
    """GET /v1/sessions of the server (httpx: the remote extra's HTTP client)."""
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket))) as client:
        answer = client.get("http://sbx/v1/sessions")
        answer.raise_for_status()
        return list(answer.json())


async def test_tools_run_on_the_server_and_eof_closes_its_sessions(
    mcp_client: McpClient, sbx_serve: Path
) -> None:
    async with mcp_client("--server", str(sbx_serve), small=False) as session:
        ran = await call(session, "run_code", code="echo remote", language="raw")
        opened = await call(session, "open_session", language="python")
        sid = text_of(opened).splitlines()[0].removeprefix("session_id: ")
        await call(session, "exec", session_id=sid, code="x = 41")
        again = await call(session, "exec", session_id=sid, code="print(x + 1)")
        assert [s["id"] for s in _server_sessions(sbx_serve) if not s["closed"]] == [sid]
    assert "stdout:\nremote" in text_of(ran)
    assert "stdout:\n42" in text_of(again)
    assert [s["id"] for s in _server_sessions(sbx_serve) if not s["closed"]] == []
