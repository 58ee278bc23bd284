"""`sbx serve` as a process: many clients at once, SIGTERM (open sessions paused and given back
under the same ids by the next server), SIGKILL (no QEMU left behind, the stale socket replaced
by the next server), and a second server refused on a live socket."""

from __future__ import annotations

import asyncio
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from .support import Server, running

pytestmark = pytest.mark.vm


async def test_fifty_concurrent_clients_are_all_answered(server: Server) -> None:
    async with server.local() as client:
        sids = [(await client.post("/sessions", json={})).json()["id"] for _ in range(2)]
    try:

        async def one(i: int) -> str:
            # Each client its own connection: 50 sockets at once, not one pooled connection.
            async with server.local() as own:
                answer = await own.post(
                    f"/sessions/{sids[i % 2]}/exec", json={"code": f"print({i} * 2)"}
                )
                return str(answer.json()["stdout"])

        outputs = await asyncio.gather(*(one(i) for i in range(50)))
        assert outputs == [f"{i * 2}\n" for i in range(50)]
    finally:
        async with server.local() as client:
            for sid in sids:
                await client.delete(f"/sessions/{sid}")


async def test_sigterm_pauses_sessions_and_the_next_server_gives_them_back(
    tmp_path: Path,
) -> None:
    first = Server(tmp_path).start()
    alice = first.token("alice")
    bob = first.token("bob")
    try:
        async with first.tcp(alice) as client:
            sid = (await client.post("/sessions", json={})).json()["id"]
            await client.post(f"/sessions/{sid}/exec", json={"code": "kept = [1, 2, 3]"})
            unused = (await client.post("/sessions", json={})).json()["id"]
    finally:
        assert first.stop(signal.SIGTERM) == 0, first.log()
    assert not first.socket.exists(), "the socket file outlived its server"
    with running(tmp_path, state_dir=first.state_dir) as second:
        async with second.tcp(bob) as other:
            assert (await other.get(f"/sessions/{sid}")).status_code == 404
        async with second.tcp(alice) as client:
            listed = (await client.get("/sessions")).json()
            assert sorted(s["id"] for s in listed) == sorted([sid, unused])
            # Closing one that was paused at shutdown forgets it without starting its VM.
            assert (await client.delete(f"/sessions/{unused}")).status_code == 204
            assert second.qemus() == []
            assert (await client.get(f"/sessions/{unused}")).status_code == 404
            out = await client.post(f"/sessions/{sid}/exec", json={"code": "print(sum(kept))"})
            assert out.json()["stdout"] == "6\n", out.text
            info = (await client.get(f"/sessions/{sid}")).json()
            assert info["owner"] == "alice" and info["exec_count"] == 2
            # Woken: its snapshot is gone (the live session is the state now).
            assert (await client.get("/snapshots")).json() == []
            await client.delete(f"/sessions/{sid}")


async def test_on_shutdown_close_leaves_nothing_to_resume(tmp_path: Path) -> None:
    first = Server(tmp_path, "--on-shutdown", "close").start()
    try:
        async with first.local() as client:
            sid = (await client.post("/sessions", json={})).json()["id"]
    finally:
        assert first.stop(signal.SIGTERM) == 0
    with running(tmp_path, state_dir=first.state_dir) as second:
        async with second.local() as client:
            assert (await client.get(f"/sessions/{sid}")).status_code == 404


async def test_sigkill_leaves_no_qemu_and_the_next_server_replaces_the_socket(
    tmp_path: Path,
) -> None:
    first = Server(tmp_path).start()
    async with first.local() as client:
        await client.post("/sessions", json={})
    assert first.qemus(), "the session has no VM"
    first.stop(signal.SIGKILL)  # asserts its QEMU died with it
    assert first.socket.exists()  # nobody removed it: stale
    with running(tmp_path, state_dir=first.state_dir) as second:
        async with second.local() as client:
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/sessions")).json() == []
        # A second server on a live socket is refused, and leaves the first one's socket be.
        refused = subprocess.run(
            [sys.executable, "-m", "exec_sandbox.cli", "serve", "--socket", str(second.socket)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0 and "already listening" in refused.stderr
        async with second.local() as client:
            assert (await client.get("/health")).status_code == 200


async def test_tls_listener_serves_https_with_tokens(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    tls = ("--host", "127.0.0.1", "--tls-cert", str(cert), "--tls-key", str(key))
    with running(tmp_path, *tls) as server:
        assert server.scheme == "https"
        token = server.token("tls-user")
        async with server.tcp(token, verify=ssl.create_default_context(cafile=cert)) as client:
            answer = await client.post("/run", json={"code": "print('over tls')"})
        assert answer.json()["stdout"] == "over tls\n"
