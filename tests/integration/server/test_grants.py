"""What an operator restricts per token on a real `sbx serve` (TCP, tokens): each grant refused
without it (forbidden, naming the option and the grant) and allowed with it, checked before
anything is reserved or started; a volume granted read-only is read-only inside the guest;
tokens stored before grants keep everything; a revoked or expired token's open WebSockets are
closed (1008); a revoked name is not reused silently.

"Before anything is reserved": the refused tokens have max_vms=0, so a request that got past
its grants would be answered limit_exceeded (429) by the reservation, never forbidden (403);
and a granted request answers 429 the same way, without a VM."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from exec_sandbox import PermanentError
from exec_sandbox.remote import RemoteScheduler
from exec_sandbox.server.grants import Grants

from .support import Server

pytestmark = pytest.mark.vm

_SECRET = {"name": "API_KEY", "value": "s3cret", "hosts": ["api.example.com"]}
# (request options, the grant they need, words of the refusal)
_CASES: list[tuple[dict[str, Any], Grants, str]] = [
    ({"allow_network": True}, Grants(network=True), "--allow-network"),
    (
        {"allow_network": True, "allowed_domains": ["api.example.com"]},
        Grants(domains=("example.com",)),
        "allowed_domains",
    ),
    ({"expose_ports": [8000]}, Grants(expose=True), "expose_ports"),
    (
        {"expose_ports": [{"internal": 8000, "external": 18080}]},
        Grants(expose=True),
        "expose_ports",
    ),
    (
        {"allow_network": True, "allowed_domains": ["api.example.com"], "secrets": [_SECRET]},
        Grants(domains=("example.com",), secrets=True),
        "secrets",
    ),
    (
        {
            "allow_network": True,
            "allowed_domains": ["api.example.com"],
            "http_headers": {"api.example.com": {"X-Key": "v"}},
        },
        Grants(domains=("example.com",), secrets=True),
        "http_headers",
    ),
    ({"volumes": {"/mnt/data": "grant-vol"}}, Grants(volumes=(("grant-vol", "rw"),)), "volume"),
]


def _without(grant: Grants) -> Grants:
    """grant less the one the case is about (domains stay when only secrets are tested)."""
    if grant.secrets:
        return Grants(domains=grant.domains)
    return Grants()


async def _answers(server: Server, token: str, options: dict[str, Any]) -> list[tuple[int, str]]:
    """(status, error code) of run and session over REST, and of a run's WebSocket."""
    out = []
    async with server.tcp(token) as client:
        for path, body in (("/run", {"code": "1", **options}), ("/sessions", options)):
            answer = await client.post(path, json=body)
            out.append((answer.status_code, answer.json()["error"]["message"]))
            assert answer.json()["error"]["code"] in ("forbidden", "limit_exceeded"), answer.text
    async with server.ws("/run", token) as ws:
        await ws.send(json.dumps({"code": "1", **options}))
        message = json.loads(await asyncio.wait_for(ws.recv(), 30))
    assert message["type"] == "error", message
    code = message["error"]["code"]
    out.append((403 if code == "forbidden" else 429, message["error"]["message"]))
    return out


@pytest.mark.parametrize(("options", "grant", "words"), _CASES)
async def test_each_grant_refused_without_it_before_any_vm(
    server: Server, options: dict[str, Any], grant: Grants, words: str
) -> None:
    name = f"grant{_CASES.index((options, grant, words))}"
    lacking = server.token(name + "-no", max_vms=0, grants=_without(grant))
    having = server.token(name + "-yes", max_vms=0, grants=grant)
    refused = await _answers(server, lacking, options)
    for status, message in refused:
        assert status == 403, refused
        assert words in message and name + "-no" in message, message
    # Granted: past the grants, stopped by the reservation (max_vms=0): no VM either way.
    allowed = await _answers(server, having, options)
    assert [s for s, _ in allowed] == [429, 429, 429], allowed
    assert server.qemus() == []


async def test_a_read_only_volume_grant_is_read_only_inside_the_guest(server: Server) -> None:
    async with server.local() as local:
        assert (await local.post("/volumes", json={"name": "ro-grant", "size_mb": 16})).is_success
        try:
            seeded = await local.post(
                "/run",
                json={
                    "code": "open('/mnt/d/seed.txt', 'w').write('seed')",
                    "volumes": {"/mnt/d": "ro-grant"},
                },
            )
            assert seeded.json()["exit_code"] == 0, seeded.text
            token = server.token("ro-user", grants=Grants.make(volumes=["ro-grant:ro"]))
            code = (
                "print(open('/mnt/d/seed.txt').read())\n"
                "try:\n    open('/mnt/d/new.txt', 'w').write('x')\nexcept OSError as e:\n"
                "    print('refused', e.errno)\n"
            )
            async with server.tcp(token) as client:
                # Asked read-write: mounted read-only all the same.
                answer = await client.post(
                    "/run",
                    json={
                        "code": code,
                        "volumes": {"/mnt/d": {"volume": "ro-grant", "read_only": False}},
                    },
                )
            result = answer.json()
            assert answer.status_code == 200, answer.text
            assert result["stdout"] == "seed\nrefused 30\n", result  # EROFS
        finally:
            await local.delete("/volumes/ro-grant")


async def test_a_token_stored_before_grants_keeps_everything(server: Server) -> None:
    token = server.token("legacy", max_vms=0)
    path = server.state_dir / "tokens.json"
    data = json.loads(path.read_text())
    for item in data["tokens"]:
        if item["name"] == "legacy":
            del item["grants"]  # as written before grants existed
    path.write_text(json.dumps(data))
    for options, _, _ in _CASES:
        answers = await _answers(server, token, options)
        assert [s for s, _ in answers] == [429, 429, 429], (options, answers)
    listed = _sbx(server, "token", "list")
    line = next(x for x in listed.stdout.splitlines() if x.startswith("legacy "))
    assert "legacy: unrestricted" in line


async def test_a_shared_session_lends_no_grants(server: Server) -> None:
    owner = server.token("lender", grants=Grants(network=True))
    borrower = server.token("borrower")  # no grants
    async with server.tcp(owner) as lender, server.tcp(borrower) as other:
        made = await lender.post("/sessions", json={"allow_network": True})
        sid = made.json()["id"]
        try:
            shared = await lender.put(
                f"/sessions/{sid}/shared_with", json={"shared_with": ["borrower"]}
            )
            assert shared.status_code == 200, shared.text
            refused = await other.post(f"/sessions/{sid}/exec", json={"code": "print(1)"})
            assert refused.status_code == 403, refused.text
            assert "borrower" in refused.json()["error"]["message"]
            mine = await lender.post(f"/sessions/{sid}/exec", json={"code": "print(1)"})
            assert mine.json()["stdout"] == "1\n"
        finally:
            await lender.delete(f"/sessions/{sid}")


async def test_revoke_closes_open_terminal_and_process_websockets(server: Server) -> None:
    token = server.token("revoked-live")
    async with server.tcp(token) as client, server.local() as local:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            spawned = await client.post(f"/sessions/{sid}/processes", json={"cmd": ["sleep", "60"]})
            pid = spawned.json()["pid"]
            async with (
                server.ws(f"/sessions/{sid}/terminal", token) as terminal,
                server.ws(f"/sessions/{sid}/processes/{pid}", token) as process,
            ):
                await terminal.send(b"echo ready\r")
                seen = b""
                while b"ready" not in seen:
                    seen += await asyncio.wait_for(terminal.recv(), 30)  # type: ignore[operator]
                assert _sbx(server, "token", "revoke", "revoked-live").returncode == 0
                codes = await asyncio.gather(_closed(terminal), _closed(process))
            assert list(codes) == [1008, 1008]
            assert (await client.get("/info")).status_code == 401
        finally:
            await local.delete(f"/sessions/{sid}")


async def test_the_python_client_reads_a_revocation_as_unauthorized(server: Server) -> None:
    token = server.token("revoked-client")
    async with RemoteScheduler(f"http://127.0.0.1:{server.port}", token) as remote:
        session = await remote.session()
        try:
            process = await session.spawn(["sh", "-c", "echo started; sleep 60"])
            reader = process.stdout.__aiter__()
            assert await anext(reader) == b"started\n"
            assert _sbx(server, "token", "revoke", "revoked-client").returncode == 0
            with pytest.raises(PermanentError) as raised:
                await anext(reader)
            assert raised.value.code == "unauthorized"  # type: ignore[attr-defined]
        finally:
            async with server.local() as local:
                await local.delete(f"/sessions/{session.session_id}")


async def test_expiry_closes_an_open_websocket(server: Server) -> None:
    token = server.token("expiring", expires_in_days=3 / 86400)
    async with server.ws("/run", token) as ws:  # opened; its request never sent
        code = await _closed(ws, within=10)
    assert code == 1008


async def _closed(ws: Any, within: float = 10.0) -> int:
    """The close code the server sent, reading (and dropping) what comes before it."""
    try:
        async with asyncio.timeout(within):
            async for _ in ws:
                pass
    except ConnectionClosed:
        pass
    assert ws.close_code is not None
    return int(ws.close_code)


async def test_a_revoked_name_is_not_reused_silently(server: Server) -> None:
    assert _sbx(server, "token", "create", "--name", "once").returncode == 0
    assert _sbx(server, "token", "revoke", "once").returncode == 0
    again = _sbx(server, "token", "create", "--name", "once")
    assert again.returncode == 2 and "--reuse-name" in again.stderr
    reused = _sbx(server, "token", "create", "--name", "once", "--reuse-name", "--allow-expose")
    assert reused.returncode == 0, reused.stderr
    async with server.tcp(reused.stdout.strip()) as client:
        assert (await client.get("/info")).json()["principal"] == "once"
    listed = _sbx(server, "token", "list")
    assert any(x.startswith("once ") and "grants: expose" in x for x in listed.stdout.splitlines())


def _sbx(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EXEC_SANDBOX_STATE_DIR": str(server.state_dir)}
    return subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_fork_and_resume_are_checked_against_what_the_session_asked(server: Server) -> None:
    # The session is made with a grant its owner's name later loses (the token revoked and
    # the name reused with less): copies of it are refused, the session itself goes on.
    first = server.token("copier", grants=Grants(expose=True))
    async with server.tcp(first) as client:
        opened = await client.post("/sessions", json={"expose_ports": [8000]})
        assert opened.status_code == 200, opened.text
    sid = opened.json()["id"]
    assert _sbx(server, "token", "revoke", "copier").returncode == 0
    reused = _sbx(server, "token", "create", "--name", "copier", "--reuse-name")
    assert reused.returncode == 0, reused.stderr
    async with server.tcp(reused.stdout.strip()) as client, server.local() as local:
        snapshot_id = None
        try:
            forked = await client.post(f"/sessions/{sid}/fork", json={"count": 1})
            assert forked.status_code == 403, forked.text
            assert "expose_ports" in forked.json()["error"]["message"]
            paused = await client.post(f"/sessions/{sid}/pause")
            assert paused.status_code == 200, paused.text
            snapshot_id = paused.json()["id"]
            resumed = await client.post(f"/snapshots/{snapshot_id}/resume")
            assert resumed.status_code == 403, resumed.text
            assert "expose_ports" in resumed.json()["error"]["message"]
        finally:
            await local.delete(f"/sessions/{sid}")
            if snapshot_id is not None:  # only this test's: the snapshot store is shared
                await local.delete(f"/snapshots/{snapshot_id}")
