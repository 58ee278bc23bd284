"""What `sbx mcp`'s tools return to a model (exec_sandbox.mcp_server.render): bounded streams
with the cut counted, images as MCP image content up to a size, files by their content, errors
with the wire's stable codes."""

from __future__ import annotations

import base64

from mcp_types import ImageContent, TextContent

from exec_sandbox import ExecutionResult, FileInfo, Output, OutputLimitError, SessionClosedError
from exec_sandbox.mcp_server import render


def _text(result: object) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))  # type: ignore[attr-defined]


def test_a_long_stream_keeps_head_and_tail_and_says_how_much_was_cut() -> None:
    text = "h" * 30_000 + "TAIL"
    shown = render.bounded(text, 1000)
    assert shown.startswith("h" * 666) and shown.endswith("TAIL")
    assert f"[... {len(text) - 1000} characters cut ...]" in shown
    assert render.bounded("short", 1000) == "short"


def test_an_execution_shows_exit_code_time_and_both_streams() -> None:
    result = ExecutionResult(stdout="o\n", stderr="e\n", exit_code=-1, execution_time_ms=12)
    assert _text(render.execution(result)) == (
        "exit_code: -1 (timed out, 12 ms)\nstdout:\no\nstderr:\ne"
    )
    assert render.execution(result).is_error is False


def test_images_are_attached_up_to_the_limit_and_only_named_past_it() -> None:
    small = b"\x89PNG" + b"x" * 10
    big = b"\x89PNG" + b"x" * render.IMAGE_MAX_BYTES
    result = render.execution(
        ExecutionResult(
            stdout="",
            stderr="",
            exit_code=0,
            outputs=[
                Output("image/png", small),
                Output("image/png", big),
                Output("text/html", "<b>"),
            ],
        )
    )
    images = [b for b in result.content if isinstance(b, ImageContent)]
    assert [base64.b64decode(i.data) for i in images] == [small]
    assert "over the 5120.0 KB limit, not attached" in _text(result)
    assert "[output: text/html, 3 bytes]" in _text(result)


def test_library_errors_are_tool_errors_led_by_their_code() -> None:
    closed = render.exception(SessionClosedError("gone"))
    assert closed.is_error is True and _text(closed) == "session_closed: gone"
    limited = render.exception(OutputLimitError("too much", stdout="kept", stderr=""))
    assert _text(limited).startswith("output_limit: too much\nstdout (kept):\nkept")


def test_a_file_is_text_an_image_or_base64_by_its_bytes() -> None:
    assert _text(render.file_content("a.txt", "é".encode())) == "é"
    png = b"\x89PNG\r\n\x1a\n\x00"
    image = render.file_content("a.bin", png)
    assert [b.mime_type for b in image.content if isinstance(b, ImageContent)] == ["image/png"]
    binary = _text(render.file_content("b", b"\xff\x00"))
    assert binary.endswith("base64:\n" + base64.b64encode(b"\xff\x00").decode())


def test_a_listing_marks_directories_and_stops_at_its_limit() -> None:
    entries = [FileInfo(f"f{i:05}", False, 1) for i in range(render.LIST_MAX_ENTRIES + 5)]
    lines = _text(render.listing("", [FileInfo("dir", True, 0), *entries])).splitlines()
    assert lines[0] == "dir/"
    assert lines[1] == "f00000  (1 bytes)"
    assert lines[-1] == "[... 6 more entries not shown]"


def test_a_result_is_bounded_in_total_however_many_outputs_the_code_made() -> None:
    figure = b"\x89PNG" + b"x" * (2 * 1024 * 1024 - 4)  # 2 MB: five fill the 10 MB per result
    texts = [Output("text/plain", "t" * 5000) for _ in range(100)]
    result = render.execution(
        ExecutionResult(
            stdout="",
            stderr="",
            exit_code=0,
            outputs=[Output("image/png", figure) for _ in range(12)] + texts,
        )
    )
    images = [b for b in result.content if isinstance(b, ImageContent)]
    assert len(images) == 5
    shown = _text(result)
    assert shown.count("per result, not attached]") == 7
    assert len(shown) < render.STREAM_MAX_CHARS + 2000
    assert "characters cut ...]" in shown

    many_small = render.execution(
        ExecutionResult(
            stdout="",
            stderr="",
            exit_code=0,
            outputs=[Output("image/png", b"\x89PNG") for _ in range(render.IMAGES_MAX_COUNT + 3)],
        )
    )
    attached = [b for b in many_small.content if isinstance(b, ImageContent)]
    assert len(attached) == render.IMAGES_MAX_COUNT
