"""What `sbx mcp` tells the model: about network access, which the operator decides (the
server's instructions and the tools' open-world hint follow the server's options), and about
arguments that miss the tools' schemas (the library's input_validation, in plain words)."""

from __future__ import annotations

import contextlib

import pytest
from mcp_types import CallToolResult

from exec_sandbox.mcp_server import build_server


async def _open_world(options: dict[str, object]) -> dict[str, bool | None]:
    server = build_server(lambda: contextlib.nullcontext(None), options=options)  # type: ignore[arg-type,return-value]
    return {
        t.name: t.annotations.open_world_hint for t in await server.list_tools() if t.annotations
    }


async def test_without_network_the_model_is_told_so_and_no_tool_is_open_world() -> None:
    server = build_server(lambda: contextlib.nullcontext(None))  # type: ignore[arg-type,return-value]
    assert server.instructions is not None
    assert server.instructions.endswith("The VMs have no network access.")
    assert set((await _open_world({})).values()) == {False}


async def test_with_allowed_domains_the_model_is_told_which_and_runs_are_open_world() -> None:
    options = {"allow_network": True, "allowed_domains": ["api.example.com"]}
    server = build_server(lambda: contextlib.nullcontext(None), options=options)  # type: ignore[arg-type,return-value]
    assert server.instructions is not None
    assert "connect to these names and their subdomains: api.example.com." in server.instructions
    hints = await _open_world(options)
    assert hints["run_code"] is True and hints["exec"] is True
    assert hints["read_file"] is False


async def test_the_limits_the_model_reads_are_the_ones_applied() -> None:
    from exec_sandbox.mcp_server import render, tools

    server = build_server(lambda: contextlib.nullcontext(None))  # type: ignore[arg-type,return-value]
    described = {t.name: t.description or "" for t in await server.list_tools()}
    assert f"cut in the middle past {render.STREAM_MAX_CHARS} characters" in described["run_code"]
    assert f"At most {tools.READ_MAX_BYTES // 1024} KB" in described["read_file"]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"code": "print(1)", "language": "cobol"}, "language: Input should be 'python'"),
        ({"code": "print(1)", "timeout_seconds": 0}, "timeout_seconds: Input should be"),
        ({}, "code: Field required"),
    ],
)
async def test_arguments_off_the_schema_are_input_validation_errors_in_plain_words(
    arguments: dict[str, object], named: str
) -> None:
    server = build_server(lambda: contextlib.nullcontext(None))  # type: ignore[arg-type,return-value]
    result = await server.call_tool("run_code", arguments)
    assert isinstance(result, CallToolResult) and result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("input_validation: run_code: ") and named in text, text
    assert "pydantic" not in text and "http" not in text
