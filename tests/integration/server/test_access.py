"""Who may do what on `sbx serve`'s TCP listener: bearer tokens (unknown, revoked, expired:
401), scopes (run refused an admin call: 403), owners (another token's session is not_found
unless shared), per-token limits (429)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import websockets

from .support import Server, running

pytestmark = pytest.mark.vm


async def test_requests_without_a_valid_token_are_unauthorized(server: Server) -> None:
    revoked = server.token("to-revoke")
    expired = server.token("expired", expires_in_days=1e-9)
    # The CLI makes the same store's tokens (printed once) and revokes them.
    made = subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli", "token", "revoke", "to-revoke"],
        env=_env(server),
        capture_output=True,
    )
    assert made.returncode == 0, made.stderr
    for token in (None, "sbx_unknown", revoked, expired):
        async with server.tcp(token) as client:
            answer = await client.get("/info")
            assert answer.status_code == 401, token
            assert answer.json()["error"]["code"] == "unauthorized"
    async with server.tcp(None) as client:
        assert (await client.get("/health")).status_code == 200  # no token needed
    # A WebSocket handshake with a bad token: an HTTP 401, and a refusal is no error in the log.
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with server.ws("/run", "sbx_unknown"):
            pass
    assert refused.value.response.status_code == 401
    assert "without completing handshake" not in server.log()


async def test_cli_token_works_at_once(server: Server) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli", "token", "create", "--name", "cli-made"],
        env=_env(server),
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    async with server.tcp(made.stdout.strip()) as client:
        info = (await client.get("/info")).json()
    assert info["principal"] == "cli-made" and info["scopes"] == ["run"]


async def test_run_scope_is_refused_admin_calls(server: Server) -> None:
    async with server.tcp(server.token("runner")) as client:
        made = await client.post("/volumes", json={"name": "nope", "size_mb": 16})
        deleted = await client.delete("/templates/whatever")
        listed = await client.get("/volumes")
    assert made.status_code == 403 and made.json()["error"]["code"] == "forbidden"
    assert deleted.status_code == 403
    assert listed.status_code == 200


async def test_tokens_do_not_see_each_others_sessions_unless_shared(server: Server) -> None:
    alice, bob = server.token("alice"), server.token("bob")
    admin = server.token("boss", scope="admin")
    async with server.tcp(alice) as a, server.tcp(bob) as b, server.tcp(admin) as boss:
        sid = (await a.post("/sessions", json={})).json()["id"]
        try:
            await a.post(f"/sessions/{sid}/exec", json={"code": "secret = 'alice'"})
            for call in (
                b.get(f"/sessions/{sid}"),
                b.post(f"/sessions/{sid}/exec", json={"code": "print(secret)"}),
                b.delete(f"/sessions/{sid}"),
                b.get(f"/sessions/{sid}/files"),
            ):
                answer = await call
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"]["code"] == "not_found"
            assert sid not in [s["id"] for s in (await b.get("/sessions")).json()]
            assert sid in [s["id"] for s in (await boss.get("/sessions")).json()]
            # Shared: bob uses it (not re-shares it); alice still owns it.
            shared = await a.put(f"/sessions/{sid}/shared_with", json={"shared_with": ["bob"]})
            assert shared.json()["shared_with"] == ["bob"]
            out = await b.post(f"/sessions/{sid}/exec", json={"code": "print(secret)"})
            assert out.json()["stdout"] == "alice\n"
            reshare = await b.put(f"/sessions/{sid}/shared_with", json={"shared_with": ["x"]})
            assert reshare.status_code == 403
            # Nor copies it: a fork would be alice's, on her limits, made by bob.
            forked = await b.post(f"/sessions/{sid}/fork", json={"count": 1})
            assert forked.status_code == 403, forked.text
            assert forked.json()["error"]["code"] == "forbidden"
            await a.put(f"/sessions/{sid}/shared_with", json={"shared_with": []})
            assert (await b.get(f"/sessions/{sid}")).status_code == 404
        finally:
            await a.delete(f"/sessions/{sid}")


async def test_per_token_session_limit_answers_429(server: Server) -> None:
    token = server.token("limited", max_sessions=1, max_vms=1)
    async with server.tcp(token) as client:
        first = await client.post("/sessions", json={})
        try:
            assert first.status_code == 200
            second = await client.post("/sessions", json={})
            assert second.status_code == 429
            assert second.json()["error"]["code"] == "limit_exceeded"
            run = await client.post("/run", json={"code": "1"})  # the one VM is the session's
            assert run.status_code == 429
            info = (await client.get("/info")).json()
            assert info["limits"]["sessions"] == 1 and info["limits"]["max_sessions"] == 1
        finally:
            await client.delete(f"/sessions/{first.json()['id']}")
        # Closed: room again.
        assert (await client.post("/run", json={"code": "print(1)"})).status_code == 200


def _env(server: Server) -> dict[str, str]:
    return {**os.environ, "EXEC_SANDBOX_STATE_DIR": str(server.state_dir)}


async def test_debug_logs_never_hold_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The WebSocket libraries log every handshake header at DEBUG: on the server (uvicorn's
    # protocol) and in the Python client (websockets). Neither may write the bearer token.
    from exec_sandbox.remote import RemoteScheduler

    with running(tmp_path, "--debug") as server:
        token = server.token("debug-logs")
        caplog.set_level(logging.DEBUG)
        url = f"http://127.0.0.1:{server.port}"
        async with RemoteScheduler(url, token) as remote:
            seen: list[str] = []
            result = await remote.run("print('streamed')", on_stdout=seen.append)
        assert result.exit_code == 0 and "streamed" in "".join(seen)
        assert "Sec-WebSocket" in server.log() or "websocket" in server.log().lower()
        assert token not in server.log()
        assert token not in caplog.text
