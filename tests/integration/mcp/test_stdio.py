"""`sbx mcp` over stdio, driven by the official `mcp` client library, code running in real VMs:
the tools and their schemas, run_code, a session's state, files, rich outputs as image content,
errors as tool errors (isError), the session cap."""

from __future__ import annotations

import base64

import pytest
from mcp_types import CallToolResult, ImageContent

from tests.integration.mcp.conftest import McpClient, call, text_of

pytestmark = pytest.mark.vm

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8  # the magic and a few bytes: what display() passes on
PNG_OBJECT = f"""
class Picture:
    def _repr_png_(self):
        return {PNG!r}
    def __repr__(self):
        return "Picture()"
display(Picture())
"""


async def test_the_tools_are_listed_with_their_input_schemas(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {
        "run_code",
        "open_session",
        "exec",
        "close_session",
        "write_file",
        "read_file",
        "list_files",
        "pause_session",
        "resume_session",
        "list_sessions",
    }
    run_code = tools["run_code"].input_schema
    assert run_code["required"] == ["code"]
    assert set(run_code["properties"]["language"]["enum"]) >= {"python", "typescript", "raw"}
    assert run_code["properties"]["timeout_seconds"]["anyOf"][0]["minimum"] == 1
    assert tools["exec"].input_schema["required"] == ["session_id", "code"]
    assert tools["write_file"].input_schema["properties"]["encoding"]["enum"] == [
        "utf-8",
        "base64",
    ]
    assert tools["read_file"].annotations is not None
    assert tools["read_file"].annotations.read_only_hint is True
    # Network access is the operator's flag, never the model's argument.
    assert "allow_network" not in run_code["properties"]


async def test_run_code_returns_exit_code_and_streams(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        result = await call(
            session,
            "run_code",
            code="import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
        )
    assert result.is_error is False
    text = text_of(result)
    assert text.startswith("exit_code: 3 ("), text
    assert "stdout:\nout" in text and "stderr:\nerr" in text


async def test_a_session_keeps_state_across_exec_calls(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        opened = text_of(await call(session, "open_session", language="python"))
        session_id = opened.splitlines()[0].removeprefix("session_id: ")
        await call(session, "exec", session_id=session_id, code="x = 41")
        result = await call(session, "exec", session_id=session_id, code="print(x + 1)")
        assert "stdout:\n42" in text_of(result)
        listed = text_of(await call(session, "list_sessions"))
        assert session_id in listed
        closed = await call(session, "close_session", session_id=session_id)
        assert closed.is_error is False
        after = await call(session, "exec", session_id=session_id, code="print(x)")
    assert after.is_error is True
    assert text_of(after).startswith("not_found:")


async def test_a_file_written_is_listed_and_read_back(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        opened = text_of(await call(session, "open_session", language="raw"))
        sid = opened.splitlines()[0].removeprefix("session_id: ")
        wrote = await call(session, "write_file", session_id=sid, path="d/a.txt", content="hé\n")
        assert wrote.is_error is False, text_of(wrote)
        binary = base64.b64encode(b"\x00\xff\x01").decode()
        await call(
            session, "write_file", session_id=sid, path="d/b.bin", content=binary, encoding="base64"
        )
        listing = text_of(await call(session, "list_files", session_id=sid, path="d"))
        text = text_of(await call(session, "read_file", session_id=sid, path="d/a.txt"))
        back = text_of(await call(session, "read_file", session_id=sid, path="d/b.bin"))
        seen = text_of(await call(session, "exec", session_id=sid, code="cat d/a.txt"))
    assert listing.splitlines() == ["a.txt  (4 bytes)", "b.bin  (3 bytes)"]
    assert text == "hé\n"
    assert back.endswith("base64:\n" + binary)
    assert "stdout:\nhé" in seen


async def test_a_png_from_display_is_image_content(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        result = await call(session, "run_code", code=PNG_OBJECT)
    images = [b for b in result.content if isinstance(b, ImageContent)]
    assert [(i.mime_type, base64.b64decode(i.data)) for i in images] == [("image/png", PNG)]
    assert "Picture()" in text_of(result)


async def test_bad_input_is_a_tool_error_with_its_code(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        unpinned = await call(session, "run_code", code="print(1)", packages=["numpy"])
        empty = await call(session, "run_code", code="   ")
        bad_base64 = await call(
            session, "write_file", session_id="x", path="a", content="%%", encoding="base64"
        )
        not_a_language = await call(session, "run_code", code="1", language="ruby")
    assert unpinned.is_error and text_of(unpinned).startswith("package_not_allowed:")
    assert empty.is_error and text_of(empty).startswith("code_validation:")
    assert bad_base64.is_error and text_of(bad_base64).startswith("input_validation:")
    assert not_a_language.is_error and "language" in text_of(not_a_language)


async def test_sessions_past_the_cap_are_refused(mcp_client: McpClient) -> None:
    async with mcp_client("--max-sessions", "1") as session:
        first = await call(session, "open_session", language="raw")
        second = await call(session, "open_session", language="raw")
    assert first.is_error is False
    assert second.is_error is True
    assert text_of(second).startswith("vm_capacity: 1 sessions are open")


async def test_a_paused_session_resumes_with_its_state(mcp_client: McpClient) -> None:
    async with mcp_client() as session:
        opened = text_of(await call(session, "open_session", language="python"))
        sid = opened.splitlines()[0].removeprefix("session_id: ")
        await call(session, "exec", session_id=sid, code="kept = 'state'")
        paused = await call(session, "pause_session", session_id=sid)
        assert paused.is_error is False, text_of(paused)
        snapshot_id = text_of(paused).splitlines()[0].removeprefix("snapshot_id: ")
        gone = await call(session, "exec", session_id=sid, code="kept")
        resumed = await call(session, "resume_session", snapshot_id=snapshot_id)
        assert resumed.is_error is False, text_of(resumed)
        new_sid = text_of(resumed).splitlines()[0].removeprefix("session_id: ")
        back = await call(session, "exec", session_id=new_sid, code="print(kept)")
    assert gone.is_error is True
    assert "stdout:\nstate" in text_of(back)


async def test_a_file_over_the_read_limit_is_refused_with_what_to_do(
    mcp_client: McpClient,
) -> None:
    async with mcp_client() as session:
        opened = text_of(await call(session, "open_session", language="raw"))
        sid = opened.splitlines()[0].removeprefix("session_id: ")
        await call(session, "exec", session_id=sid, code="head -c 300000 /dev/zero > big")
        result = await call(session, "read_file", session_id=sid, path="big")
    assert result.is_error is True
    assert text_of(result).startswith("input_validation: big is 300000 bytes, over the")
    assert "exec" in text_of(result)


async def test_output_streams_as_progress_to_a_client_that_asks(mcp_client: McpClient) -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    code = (
        "import time\nfor i in range(4):\n    print(f'line {i}', flush=True)\n    time.sleep(0.4)"
    )
    async with mcp_client() as session:
        result = await session.call_tool("run_code", {"code": code}, progress_callback=on_progress)
    assert isinstance(result, CallToolResult)
    assert "line 3" in text_of(result)
    assert len(seen) >= 2, seen
    assert [p for p, _ in seen] == sorted({p for p, _ in seen}), "progress only grows"
    assert seen[0][1] is not None and seen[0][1].startswith("line 0")
