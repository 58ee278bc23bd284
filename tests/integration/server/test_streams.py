"""The WebSockets of `sbx serve` (docs/server.md, "Streaming") with real VMs: output arrives
while the code runs; a client that goes away cancels a run (its VM goes) but not a session's
exec; a client that stops reading is disconnected while the exec goes on; processes and the
terminal."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from .support import Server

pytestmark = pytest.mark.vm

_TWO_PARTS = "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')\n"


async def _messages(ws: ClientConnection) -> list[tuple[float, dict[str, Any]]]:
    """Every message until the server closes, with the time each came."""
    out = []
    async for raw in ws:
        out.append((time.monotonic(), json.loads(raw)))
    return out


async def test_run_output_arrives_before_the_result(server: Server) -> None:
    async with server.ws("/run") as ws:
        await ws.send(json.dumps({"code": _TWO_PARTS}))
        messages = await _messages(ws)
    kinds = [m["type"] for _, m in messages]
    assert kinds[0] == "stdout" and kinds[-1] == "result"
    first_at = messages[0][0]
    result_at = messages[-1][0]
    assert messages[0][1]["data"].startswith("first")
    assert result_at - first_at > 1.0, "the first line came only with the result"
    assert messages[-1][1]["result"]["stdout"] == "first\nsecond\n"


async def test_exec_streams_and_errors_are_final_messages(server: Server) -> None:
    token = server.token("streamer")
    async with server.tcp(token) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            async with server.ws(f"/sessions/{sid}/exec", token) as ws:
                await ws.send(json.dumps({"code": _TWO_PARTS}))
                messages = await _messages(ws)
            assert messages[-1][0] - messages[0][0] > 1.0
            assert messages[-1][1]["result"]["exit_code"] == 0
            async with server.ws(f"/sessions/{sid}/exec", token) as ws:
                await ws.send(json.dumps({"code": "1", "bogus": True}))
                (_, error), *_ = await _messages(ws)
            assert error["type"] == "error" and error["error"]["code"] == "input_validation"
            async with server.ws("/sessions/nosuch/exec", token) as ws:
                await ws.send(json.dumps({"code": "1"}))
                (_, error), *_ = await _messages(ws)
            assert error["error"]["code"] == "not_found"
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_unauthorized_websocket_is_refused(server: Server) -> None:
    with pytest.raises(Exception) as refused:
        async with server.ws("/run", "sbx_not-a-token") as ws:
            await ws.recv()
    assert "401" in str(refused.value)


async def test_run_client_gone_cancels_the_run_and_its_vm(server: Server) -> None:
    before = set(server.qemus())
    async with server.ws("/run") as ws:
        code = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
        await ws.send(json.dumps({"code": code}))
        assert json.loads(await ws.recv())["data"].startswith("up")
        assert set(server.qemus()) - before, "no VM ran the code"
    async with server.local() as client:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            vms = (await client.get("/info")).json()["limits"]["vms"]
            if vms == 0 and not set(server.qemus()) - before:
                break
            await asyncio.sleep(0.2)
    assert not set(server.qemus()) - before, "the run's VM outlived its client"
    assert vms == 0, "the run still counts against its token"


async def test_exec_client_gone_lets_the_exec_finish(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            async with server.ws(f"/sessions/{sid}/exec") as ws:
                code = "import time\nprint('up', flush=True)\ntime.sleep(2)\nfinished = 'yes'\n"
                await ws.send(json.dumps({"code": code}))
                assert json.loads(await ws.recv())["data"].startswith("up")
            # The next exec waits for the abandoned one, which ran to its end.
            out = await client.post(f"/sessions/{sid}/exec", json={"code": "print(finished)"})
            assert out.json()["stdout"] == "yes\n"
            assert (await client.get(f"/sessions/{sid}")).json()["closed"] is False
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_client_that_stops_reading_is_dropped_and_the_exec_goes_on(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            code = (
                "import sys\nfor _ in range(970):\n    sys.stdout.write('x' * 1023 + '\\n')\n"
                "    sys.stdout.flush()\ndone = 1\n"
            )
            async with server.ws(f"/sessions/{sid}/exec", max_queue=1) as ws:
                await ws.send(json.dumps({"code": code}))
                await asyncio.sleep(6)  # not reading while the code prints ~1 MB
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            out = await client.post(f"/sessions/{sid}/exec", json={"code": "print(done)"})
            assert out.json()["stdout"] == "1\n"
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_process_attach_streams_output_stdin_and_exit(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            spawn = {"cmd": "echo out; echo err >&2; read line; echo got $line; exit 3"}
            pid = (await client.post(f"/sessions/{sid}/processes", json=spawn)).json()["pid"]
            async with server.ws(f"/sessions/{sid}/processes/{pid}") as ws:
                data = base64.b64encode(b"hello\n").decode()
                await ws.send(json.dumps({"type": "stdin", "data": {"base64": data}}))
                messages = [m for _, m in await _messages(ws)]
            streams: dict[str, bytes] = {"stdout": b"", "stderr": b""}
            for m in messages[:-1]:
                streams[m["type"]] += base64.b64decode(m["data"]["base64"])
            assert streams == {"stdout": b"out\ngot hello\n", "stderr": b"err\n"}
            assert messages[-1] == {"type": "exit", "exit_code": 3}
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_process_attach_closes_stdin_and_kills(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            cat = (await client.post(f"/sessions/{sid}/processes", json={"cmd": ["cat"]})).json()
            async with server.ws(f"/sessions/{sid}/processes/{cat['pid']}") as ws:
                await ws.send(json.dumps({"type": "close_stdin"}))
                messages = [m for _, m in await _messages(ws)]
            assert messages[-1] == {"type": "exit", "exit_code": 0}  # EOF ended cat
            spec = {"cmd": "echo started; sleep 600"}
            pid = (await client.post(f"/sessions/{sid}/processes", json=spec)).json()["pid"]
            async with server.ws(f"/sessions/{sid}/processes/{pid}") as ws:
                first = json.loads(await ws.recv())
                assert base64.b64decode(first["data"]["base64"]) == b"started\n"
                await ws.send(json.dumps({"type": "kill", "signal": 9}))
                messages = [m for _, m in await _messages(ws)]
            assert messages[-1] == {"type": "exit", "exit_code": 128 + 9}
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_terminal_echoes_resizes_and_hangs_up_when_the_client_goes(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            async with server.ws(f"/sessions/{sid}/terminal?cols=100&rows=30") as ws:
                await ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
                await ws.send(b"stty size; echo mark-$((6*7))\r")
                seen = b""
                while b"mark-42" not in seen:
                    seen += await asyncio.wait_for(ws.recv(), 30)  # type: ignore[operator]
                assert b"40 120" in seen
            # The client went: the shell got SIGHUP, its process ended.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                listed = (await client.get(f"/sessions/{sid}/processes")).json()
                if all(not p["running"] for p in listed if p["pty"]):
                    break
                await asyncio.sleep(0.2)
            assert all(not p["running"] for p in listed if p["pty"])
            async with server.ws(f"/sessions/{sid}/terminal") as ws:
                await ws.send(b"exit 5\r")
                last: Any = None
                async for frame in ws:
                    last = frame
            assert json.loads(last) == {"type": "exit", "exit_code": 5}
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_rest_run_whose_client_gave_up_is_cancelled(server: Server) -> None:
    before = set(server.qemus())
    code = "import time\ntime.sleep(60)\n"
    async with server.local() as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/run", json={"code": code}, timeout=3)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            vms = (await client.get("/info")).json()["limits"]["vms"]
            if vms == 0 and not set(server.qemus()) - before:
                break
            await asyncio.sleep(0.2)
    assert not set(server.qemus()) - before, "the run's VM outlived its client"
    assert vms == 0


async def _stdout_of(ws: ClientConnection) -> tuple[bytes, dict[str, Any]]:
    out = b""
    last: dict[str, Any] = {}
    async for raw in ws:
        last = json.loads(raw)
        if last["type"] == "stdout":
            out += base64.b64decode(last["data"]["base64"])
    return out, last


async def test_fifty_clients_of_one_process_get_all_of_its_output(server: Server) -> None:
    # One guest reader serves them all (server/fanout.py): one reader per client would take
    # more held guest reads than a VM has, and the clients past them would poll.
    lines = "".join(f"line-{i}\n" for i in range(1, 31)).encode()
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            spec = {"cmd": "sleep 2; for i in $(seq 1 30); do echo line-$i; sleep 0.05; done"}
            pid = (await client.post(f"/sessions/{sid}/processes", json=spec)).json()["pid"]

            async def watch() -> tuple[bytes, dict[str, Any]]:
                async with server.ws(f"/sessions/{sid}/processes/{pid}") as ws:
                    return await asyncio.wait_for(_stdout_of(ws), 120)

            seen = await asyncio.gather(*(watch() for _ in range(50)))
            assert all(out == lines for out, _ in seen), {out for out, _ in seen}
            assert all(last == {"type": "exit", "exit_code": 0} for _, last in seen)
            # A client attaching after the end gets what the guest still holds.
            assert await watch() == (lines, {"type": "exit", "exit_code": 0})
        finally:
            await client.delete(f"/sessions/{sid}")


async def test_a_client_that_stops_reading_does_not_hold_up_the_others(server: Server) -> None:
    async with server.local() as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        try:
            # 6 MB of output (more than the 4 MiB a client may fall behind), written once the
            # clients are attached, at a pace the host reads without the guest's buffer (its
            # last 1 MiB) dropping any.
            burst = "head -c 75000 /dev/zero | base64 -w 1000; sleep 0.05"
            spec = {"cmd": f"read go; for i in $(seq 60); do {burst}; done"}
            pid = (await client.post(f"/sessions/{sid}/processes", json=spec)).json()["pid"]
            path = f"/sessions/{sid}/processes/{pid}"
            async with contextlib.AsyncExitStack() as stack:
                stalled = await stack.enter_async_context(server.ws(path, max_queue=1))
                readers = [await stack.enter_async_context(server.ws(path)) for _ in range(3)]
                go = base64.b64encode(b"go\n").decode()
                await readers[0].send(json.dumps({"type": "stdin", "data": {"base64": go}}))
                seen = await asyncio.gather(
                    *(asyncio.wait_for(_stdout_of(ws), 180) for ws in readers)
                )
                assert all(len(out) == 6_006_000 for out, _ in seen), [len(o) for o, _ in seen]
                assert all(last["type"] == "exit" for _, last in seen)
                # The one that read nothing was dropped as too slow.
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await asyncio.wait_for(stalled.recv(), 60)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        finally:
            await client.delete(f"/sessions/{sid}")
