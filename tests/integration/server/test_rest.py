"""Every REST endpoint of docs/server.md against a real `sbx serve` with real VMs, on its Unix
socket (principal `local`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from exec_sandbox import ExecutionResult, wire

from .support import Server

pytestmark = pytest.mark.vm


async def test_health_and_info_answer(server: Server) -> None:
    async with server.local() as client:
        health = (await client.get("/health")).json()
        info = (await client.get("/info")).json()
    assert health["status"] == "ok" and health["version"]
    assert info["principal"] == "local"
    assert set(info["scopes"]) == {"run", "admin"}
    assert info["accelerator"] in ("kvm", "tcg", "hvf")


async def test_run_returns_the_execution_result(server: Server) -> None:
    async with server.local() as client:
        answer = await client.post("/run", json={"code": "print(6 * 7)", "env_vars": {"A": "1"}})
    assert answer.status_code == 200
    result = wire.decode(ExecutionResult, answer.json())
    assert result.stdout == "42\n" and result.exit_code == 0


async def test_errors_carry_stable_codes_and_statuses(server: Server) -> None:
    async with server.local() as client:
        unknown_option = await client.post("/run", json={"code": "1", "bogus": 1})
        not_json = await client.post("/run", content=b"{nope")
        bad_code = await client.post("/run", json={"code": 5})
        no_session = await client.get("/sessions/0123456789abcdef")
        bad_language = await client.post("/run", json={"code": "1", "language": "cobol"})
    assert unknown_option.status_code == 400
    assert unknown_option.json()["error"]["code"] == "input_validation"
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "bad_request"
    assert bad_code.status_code == 400
    assert no_session.status_code == 404 and no_session.json()["error"]["code"] == "not_found"
    assert bad_language.status_code == 400
    assert bad_language.json()["error"]["code"] in wire.ERROR_CODES


async def test_session_keeps_state_and_files(server: Server) -> None:
    async with server.local() as client:
        info = (await client.post("/sessions", json={"language": "python"})).json()
        sid = info["id"]
        assert info["owner"] == "local" and info["closed"] is False
        assert sid in [s["id"] for s in (await client.get("/sessions")).json()]
        await client.post(f"/sessions/{sid}/exec", json={"code": "x = 41"})
        result = (await client.post(f"/sessions/{sid}/exec", json={"code": "print(x + 1)"})).json()
        assert result["stdout"] == "42\n"
        put = await client.put(
            f"/sessions/{sid}/files/content", params={"path": "d/a.bin"}, content=b"\x00\xffhi"
        )
        assert put.status_code == 204
        listing = (await client.get(f"/sessions/{sid}/files", params={"path": "d"})).json()
        assert listing == [{"name": "a.bin", "is_dir": False, "size": 4}]
        content = await client.get(f"/sessions/{sid}/files/content", params={"path": "d/a.bin"})
        assert content.content == b"\x00\xffhi"
        missing = await client.get(f"/sessions/{sid}/files/content", params={"path": "nope"})
        assert missing.status_code >= 400 and "error" in missing.json()
        assert (await client.get(f"/sessions/{sid}/network_log")).json() == []
        bad_install = await client.post(
            f"/sessions/{sid}/install", json={"packages": ["not a spec!!"]}
        )
        assert bad_install.status_code == 400
        assert bad_install.json()["error"]["code"] == "package_not_allowed"
        got = (await client.get(f"/sessions/{sid}")).json()
        assert got["exec_count"] == 2
        assert (await client.delete(f"/sessions/{sid}")).status_code == 204
        gone = await client.post(f"/sessions/{sid}/exec", json={"code": "1"})
        assert gone.status_code == 404


async def test_processes_spawn_list_stdin_wait_kill(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            cat = (await client.post(f"/sessions/{sid}/processes", json={"cmd": ["cat"]})).json()
            pid = cat["pid"]
            assert cat["running"] is True
            stdin = await client.post(
                f"/sessions/{sid}/processes/{pid}/stdin", params={"close": "true"}, content=b"hey"
            )
            assert stdin.status_code == 204
            waited = (
                await client.post(f"/sessions/{sid}/processes/{pid}/wait", params={"timeout": 30})
            ).json()
            assert waited["exit_code"] == 0 and waited["stdout_bytes"] == 3
            sleeper = (
                await client.post(f"/sessions/{sid}/processes", json={"cmd": "sleep 600"})
            ).json()
            listed = (await client.get(f"/sessions/{sid}/processes")).json()
            assert {p["pid"] for p in listed} >= {pid, sleeper["pid"]}
            kill = await client.post(
                f"/sessions/{sid}/processes/{sleeper['pid']}/kill", json={"signal": 9}
            )
            assert kill.status_code == 204
            for _ in range(50):
                info = (await client.get(f"/sessions/{sid}/processes/{sleeper['pid']}")).json()
                if not info["running"]:
                    break
                await asyncio.sleep(0.1)
            assert info["exit_code"] == 128 + 9
            missing = await client.get(f"/sessions/{sid}/processes/99999")
            assert missing.status_code == 404
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_pause_resume_fork_and_snapshots(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        await client.post(f"/sessions/{sid}/exec", json={"code": "v = 'kept'"})
        forks = (await client.post(f"/sessions/{sid}/fork", json={"count": None})).json()
        assert len(forks) == 1 and forks[0]["id"] != sid
        fork_out = await client.post(f"/sessions/{forks[0]['id']}/exec", json={"code": "print(v)"})
        assert fork_out.json()["stdout"] == "kept\n"
        await client.delete(f"/sessions/{forks[0]['id']}")
        snapshot = (await client.post(f"/sessions/{sid}/pause")).json()
        assert (await client.get(f"/sessions/{sid}")).json()["closed"] is True
        assert snapshot["id"] in [s["id"] for s in (await client.get("/snapshots")).json()]
        resumed = (await client.post(f"/snapshots/{snapshot['id']}/resume")).json()
        out = await client.post(f"/sessions/{resumed['id']}/exec", json={"code": "print(v)"})
        assert out.json()["stdout"] == "kept\n"
        await client.delete(f"/sessions/{resumed['id']}")
        assert (await client.delete(f"/snapshots/{snapshot['id']}")).status_code == 204
        again = await client.post(f"/snapshots/{snapshot['id']}/resume")
        assert again.status_code == 404


async def test_templates_and_volumes_listed_volumes_made(server: Server) -> None:
    async with server.local() as client:
        assert isinstance((await client.get("/templates")).json(), list)
        made = await client.post("/volumes", json={"name": "srvtest", "size_mb": 16})
        assert made.status_code == 200 and made.json()["size_mb"] == 16
        assert "srvtest" in [v["name"] for v in (await client.get("/volumes")).json()]
        assert (await client.delete("/volumes/srvtest")).status_code == 204
        assert (await client.delete("/volumes/srvtest")).status_code == 404
        unknown_step = await client.post("/templates", json={"name": "t", "steps": [{"x": 1}]})
        assert unknown_step.status_code == 400
        host_path = await client.post("/templates", json={"name": "t", "image": "/etc"})
        assert host_path.status_code == 400
        assert (await client.delete("/templates/nosuch")).status_code == 404


async def test_served_openapi_is_the_checked_in_one(server: Server) -> None:
    checked_in = json.loads((Path(__file__).parents[3] / "docs" / "openapi.json").read_text())
    async with server.local() as client:
        served = (await client.get("http://sbx/openapi.json")).json()
    assert served == checked_in, "docs/openapi.json is stale: sbx serve --print-openapi > it"
    assert "/v1/sessions/{session_id}/exec" in served["paths"]
