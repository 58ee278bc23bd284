"""display(): objects to rich outputs, IPython's conventions, sent through the host socket.

Each object gives one output per MIME type: what its `_repr_mimebundle_()` returns, then each of
the `_repr_*_` methods below that exists and returns something (for a type the bundle did not
have), then text/plain, `repr(obj)`, unless the bundle had it. A matplotlib Figure gives
image/png. Text types travel as UTF-8, images as their bytes (a str is taken as base64, as
IPython's formatters give it).
"""

import sys

from . import _client

# The formatter methods IPython looks for, in the order their outputs are sent.
FORMATTERS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_json_", "application/json"),
    ("_repr_latex_", "text/latex"),
)

_TEXT_TYPES = frozenset(("image/svg+xml", "application/javascript", "application/xml"))


def is_text(mime: str) -> bool:
    mime = mime.lower()
    return (
        mime.startswith("text/")
        or mime in _TEXT_TYPES
        or mime == "application/json"
        or mime.endswith(("+json", "+xml"))
    )


def _is_json(mime: str) -> bool:
    mime = mime.lower()
    return mime == "application/json" or mime.endswith("+json")


def encode(mime: str, value: object) -> bytes:
    """A formatter's value as the output's bytes."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]  # (data, metadata), as IPython's formatters may return
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        if is_text(mime):
            return value.encode("utf-8", "surrogateescape")
        import binascii

        try:
            return binascii.a2b_base64(value.encode("ascii"))
        except (ValueError, binascii.Error) as exc:
            raise ValueError(f"{mime}: a str that is not base64: {exc}") from None
    if _is_json(mime):
        import json

        return json.dumps(value, ensure_ascii=False).encode()
    raise TypeError(f"{mime}: {type(value).__name__} is neither str nor bytes")


def _figure_png(fig: object) -> bytes:
    from io import BytesIO

    buf = BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")  # type: ignore[attr-defined]
    return buf.getvalue()


def _is_figure(obj: object) -> bool:
    # Only when matplotlib is already loaded: display() never imports it.
    module = sys.modules.get("matplotlib.figure")
    return module is not None and isinstance(obj, module.Figure)


def _formatter_failed(what: str) -> None:
    # As IPython does: a broken formatter is reported and the others still render.
    import traceback

    print(f"exec-sandbox: {what} failed:", file=sys.stderr)
    traceback.print_exc()


def bundle(obj: object) -> list[tuple[str, bytes]]:
    """The (MIME type, data) outputs of one object, in the order they are sent."""
    outputs: dict[str, bytes] = {}
    # A class is not displayed through the instance methods it defines.
    if not isinstance(obj, type):
        if _is_figure(obj):
            outputs["image/png"] = _figure_png(obj)
        method = getattr(obj, "_repr_mimebundle_", None)
        if callable(method):
            try:
                got = method(include=None, exclude=None)
                if isinstance(got, tuple) and len(got) == 2:
                    got = got[0]
                for mime, value in (got or {}).items():
                    if mime not in outputs and value is not None:
                        outputs[mime] = encode(mime, value)
            except Exception:
                _formatter_failed("_repr_mimebundle_")
        for name, mime in FORMATTERS:
            if mime in outputs:
                continue
            method = getattr(obj, name, None)
            if not callable(method):
                continue
            try:
                value = method()
                if value is not None:
                    outputs[mime] = encode(mime, value)
            except Exception:
                _formatter_failed(name)
    if "text/plain" not in outputs:
        outputs["text/plain"] = repr(obj).encode("utf-8", "surrogateescape")
    else:
        outputs["text/plain"] = outputs.pop("text/plain")  # the fallback goes last
    return list(outputs.items())


def send(mime: str, data: bytes) -> bool:
    """One output to the host; a refusal is a line on stderr, never an exception."""
    reason = _client.output(mime, data)
    if reason is None:
        return True
    try:
        print(f"exec-sandbox: output dropped: {reason}", file=sys.stderr, flush=True)
    except Exception:
        pass
    return False


def display(*objs: object) -> None:
    for obj in objs:
        for mime, data in bundle(obj):
            send(mime, data)
        if _is_figure(obj):
            # Shown: pyplot must not send it again at the end of the run (mpl_backend).
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:
                pyplot.close(obj)
