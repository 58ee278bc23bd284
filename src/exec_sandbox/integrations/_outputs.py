"""Rich outputs (`ExecutionResult.outputs`) as the frameworks carry them: text the model reads
for every framework, images as content blocks where the framework has them (LangChain), and a
JSON-safe form for artifacts."""

from __future__ import annotations

import base64
from typing import Any

from exec_sandbox import Output

# Types a chat model can be shown as an image.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
# A text/plain output longer than this is cut in the text the model reads (the whole value is
# in the artifact): a huge repr would crowd out everything else in its context.
_TEXT_MAX = 10_000


def _size(data: bytes | str) -> str:
    n = len(data.encode() if isinstance(data, str) else data)
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KB"


def outputs_text(outputs: list[Output]) -> str:
    """The outputs for a model that reads text: text/plain values as they are (a cell's last
    expression, display()), every other type named with its size ("[output: image/png,
    23.4 KB]"), in order; "" when there are none."""
    lines = []
    for output in outputs:
        if output.mime_type == "text/plain" and isinstance(output.data, str):
            text = output.data
            if len(text) > _TEXT_MAX:
                text = text[:_TEXT_MAX] + f"... [{len(output.data) - _TEXT_MAX} more characters]"
            lines.append(text)
        else:
            lines.append(f"[output: {output.mime_type}, {_size(output.data)}]")
    return "\n".join(lines)


def image_blocks(outputs: list[Output]) -> list[dict[str, Any]]:
    """The image outputs as LangChain's standard image content blocks (base64)."""
    return [
        {
            "type": "image",
            "base64": base64.b64encode(output.data).decode(),
            "mime_type": output.mime_type,
        }
        for output in outputs
        if output.mime_type in IMAGE_TYPES and isinstance(output.data, bytes)
    ]


def outputs_artifact(outputs: list[Output]) -> list[dict[str, str]]:
    """JSON-safe outputs: text as it is, binary data base64 (`"encoding": "base64"`)."""
    items = []
    for output in outputs:
        if isinstance(output.data, str):
            items.append({"mime_type": output.mime_type, "data": output.data})
        else:
            items.append(
                {
                    "mime_type": output.mime_type,
                    "data": base64.b64encode(output.data).decode(),
                    "encoding": "base64",
                }
            )
    return items
