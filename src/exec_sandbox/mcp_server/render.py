"""What a tool call returns to the model: an ExecutionResult, a file, a listing or an error as MCP
content blocks. Everything is bounded, because it lands in a model's context window: a stream
keeps its head and its tail (an error's traceback is at the end) with the number of characters
cut in between; images travel as MCP image content up to a size, larger ones are only named.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent

from .. import wire
from ..errors import OutputLimitError
from ..models import ExecutionResult, FileInfo, Output

# Characters of one stream (stdout, stderr, a text output) shown to the model; the rest is cut
# from the middle and the cut is said in its place.
STREAM_MAX_CHARS = 20_000
# Bytes of one image returned as image content (a figure is ~20-200 KB); larger ones are named.
IMAGE_MAX_BYTES = 5 * 1024 * 1024
# Images attached to one result, and their bytes together: code that draws in a loop gives a
# hundred figures, which no context window wants; the rest are named.
IMAGES_MAX_COUNT = 8
IMAGES_MAX_TOTAL_BYTES = 10 * 1024 * 1024
# Image types MCP clients show to a model.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
# Entries of one directory listing shown.
LIST_MAX_ENTRIES = 1000


def bounded(text: str, limit: int = STREAM_MAX_CHARS) -> str:
    """text, or its head and tail with "[... N characters cut ...]" between them."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KB"


def _data_size(data: bytes | str) -> int:
    return len(data.encode() if isinstance(data, str) else data)


def _status(result: ExecutionResult) -> str:
    detail = []
    if result.exit_code == -1:
        detail.append("timed out")
    elif result.exit_code > 128:
        detail.append(f"killed by signal {result.exit_code - 128}")
    if result.execution_time_ms is not None:
        detail.append(f"{result.execution_time_ms} ms")
    return f"exit_code: {result.exit_code}" + (f" ({', '.join(detail)})" if detail else "")


def _outputs(outputs: Sequence[Output]) -> tuple[list[str], list[ImageContent]]:
    """Rich outputs: text/plain values (the last expression, display()) as text; images as image
    content; every other type (HTML, SVG, JSON, ...) named with its size. An object shown in
    several types gives one Output per type: when an image of it is shown, its text/plain
    stand-in ("<Figure size ...>") still reads as what it is. The lines together are bounded
    by the caller as one stream; images by IMAGES_MAX_COUNT and IMAGES_MAX_TOTAL_BYTES."""
    lines: list[str] = []
    images: list[ImageContent] = []
    attached_bytes = 0
    for output in outputs:
        data = output.data
        if output.mime_type == "text/plain" and isinstance(data, str):
            lines.append(data)
        elif output.mime_type in IMAGE_TYPES and isinstance(data, bytes):
            full = attached_bytes + len(data) > IMAGES_MAX_TOTAL_BYTES
            if len(images) >= IMAGES_MAX_COUNT or full:
                lines.append(
                    f"[image: {output.mime_type}, {_size(len(data))}: over the limit of "
                    f"{IMAGES_MAX_COUNT} images, {_size(IMAGES_MAX_TOTAL_BYTES)} in all, "
                    "per result, not attached]"
                )
            elif len(data) <= IMAGE_MAX_BYTES:
                attached_bytes += len(data)
                images.append(
                    ImageContent(
                        type="image",
                        data=base64.b64encode(data).decode("ascii"),
                        mime_type=output.mime_type,
                    )
                )
                lines.append(f"[image: {output.mime_type}, {_size(len(data))}, attached]")
            else:
                lines.append(
                    f"[image: {output.mime_type}, {_size(len(data))}: over the "
                    f"{_size(IMAGE_MAX_BYTES)} limit, not attached]"
                )
        else:
            lines.append(f"[output: {output.mime_type}, {_size(_data_size(data))}]")
    return lines, images


def execution(result: ExecutionResult) -> CallToolResult:
    """The status line (exit code, time), stdout, stderr and rich outputs of one run or exec.
    A program's own failure (exit code != 0, a timeout) is a result, not a tool error: the
    model reads it and fixes its code."""
    parts = [_status(result)]
    # A stream's own last newline is not shown: the next section starts on a line anyway.
    if result.stdout:
        parts.append("stdout:\n" + bounded(result.stdout.removesuffix("\n")))
    if result.stderr:
        parts.append("stderr:\n" + bounded(result.stderr.removesuffix("\n")))
    lines, images = _outputs(result.outputs)
    if lines:
        parts.append("outputs:\n" + bounded("\n".join(lines)))
    if not result.stdout and not result.stderr and not lines:
        parts.append("(no output)")
    content: list[ContentBlock] = [TextContent(type="text", text="\n".join(parts))]
    content.extend(images)
    return CallToolResult(content=content)


def text(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)])


def error(message: str) -> CallToolResult:
    """A tool error (isError): the call did not do what was asked, the message says why."""
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def exception(exc: BaseException) -> CallToolResult:
    """A library exception as a tool error: its stable code (docs/server.md, the same code the
    HTTP API answers with), its message, and for an output limit what was kept."""
    message = f"{wire.error_code(exc)}: {exc}"
    if isinstance(exc, OutputLimitError):
        if exc.stdout:
            message += "\nstdout (kept):\n" + bounded(exc.stdout)
        if exc.stderr:
            message += "\nstderr (kept):\n" + bounded(exc.stderr)
    return error(message)


def file_content(path: str, data: bytes) -> CallToolResult:
    """A file read back: UTF-8 text as it is; an image as image content; other bytes base64."""
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None:
        return text(decoded)
    mime = _image_type(data)
    if mime is not None:
        image = ImageContent(
            type="image", data=base64.b64encode(data).decode("ascii"), mime_type=mime
        )
        note = TextContent(type="text", text=f"{path}: {mime}, {_size(len(data))}")
        return CallToolResult(content=[note, image])
    encoded = base64.b64encode(data).decode("ascii")
    return text(f"{path}: binary, {_size(len(data))}, base64:\n{encoded}")


def _image_type(data: bytes) -> str | None:
    """The image type of data by its magic bytes (never by the file's name)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def listing(path: str, entries: Sequence[FileInfo]) -> CallToolResult:
    """One line per entry, directories marked with "/", sorted by name."""
    if not entries:
        return text(f"{path or '/home/user'}: empty")
    ordered = sorted(entries, key=lambda e: e.name)
    lines = [
        f"{e.name}/" if e.is_dir else f"{e.name}  ({_size(e.size)})"
        for e in ordered[:LIST_MAX_ENTRIES]
    ]
    if len(ordered) > LIST_MAX_ENTRIES:
        lines.append(f"[... {len(ordered) - LIST_MAX_ENTRIES} more entries not shown]")
    return text("\n".join(lines))
