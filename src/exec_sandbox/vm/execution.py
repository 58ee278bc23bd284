"""One execution in a guest, as the host sees it: the request (`ExecRequest`), its output
streams while it runs (`OutputStream`), its rich outputs (`RichOutputs`) and what the guest
reported at its end (`ExecOutcome`). `results.py` turns an outcome into the API's
ExecutionResult."""

from __future__ import annotations

import asyncio
import codecs
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..models import Language, Output, ToolCall
from .binding import PROTOCOL_LIMITS

if TYPE_CHECKING:
    from ..host_tools import HostTools

OutputCallback = Callable[[str], None]
# The reserved host-socket tool of the guest's pip (installs.py): the JSON arguments in, the JSON
# answer out. Never a user tool (their names may not start with "_").
INSTALL_TOOL = "_sbx_install"
InstallCall = Callable[[bytes], Awaitable[bytes]]


@dataclass
class ExecRequest:
    language: Language
    code: bytes
    timeout_ms: int
    env: list[tuple[bytes, bytes]]
    stdout_limit: int
    stderr_limit: int
    on_stdout: OutputCallback | None = None
    on_stderr: OutputCallback | None = None
    session: bool = False  # run in the VM's persistent REPL (SESSION_EXEC)
    tools: HostTools | None = None  # what the code may call on the host (TOOL_CALL)
    installer: InstallCall | None = None  # serves INSTALL_TOOL (a session's installs)


@dataclass
class ExecOutcome:
    stdout: str
    stderr: str
    exit_code: int
    flags: int
    duration_us: int
    outputs: list[Output] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)


class OutputStream:
    """One of stdout/stderr of a running execution: decodes UTF-8 incrementally, so that chunks
    split inside a character reach the callback whole, and keeps the text for the result."""

    def __init__(self, name: str, callback: OutputCallback | None) -> None:
        self.name = name
        self._callback = callback
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        self.byte_count = 0

    def feed(self, data: bytes, final: bool = False) -> None:
        self.byte_count += len(data)
        text = self._decoder.decode(data, final)
        if not text:
            return
        self._parts.append(text)
        if self._callback is not None:
            try:
                self._callback(text)
            except Exception as exc:  # a user callback must not break the execution
                warnings.warn(
                    f"on_{self.name} callback raised {exc!r}; it is disabled for this execution",
                    RuntimeWarning,
                    stacklevel=1,
                )
                self._callback = None

    def text(self) -> str:
        self.feed(b"", final=True)
        return "".join(self._parts)


# The protocol's limits on rich outputs and tool calls (src/shared/protocol.h): the guest
# enforces them, and a guest that passes them loses its VM.
OUTPUT_BEGIN = PROTOCOL_LIMITS["OUTPUT_BEGIN"]
OUTPUT_END = PROTOCOL_LIMITS["OUTPUT_END"]
OUTPUT_ITEM_MAX = PROTOCOL_LIMITS["OUTPUT_ITEM_MAX"]
OUTPUTS_MAX = PROTOCOL_LIMITS["OUTPUTS_MAX"]
OUTPUT_BYTES_MAX = PROTOCOL_LIMITS["OUTPUT_BYTES_MAX"]
TOOL_CALLS_MAX = PROTOCOL_LIMITS["TOOL_CALLS_MAX"]
# The log of an execution's tool calls (ExecOutcome.tool_calls). Only 16 calls are in flight,
# but the code may make one after the other for as long as it runs, each with 60 KiB of
# arguments: kept whole, the log would grow with the guest's traffic, in the host's memory.
TOOL_CALL_LOG_MAX = 1024  # records; later calls still run, unlogged
TOOL_CALL_LOG_TEXT_MAX = 1024 * 1024  # characters of arguments and errors kept whole
TOOL_CALL_LOG_CUT = 256  # what a record past that budget keeps of each

# MIME types whose data is text (ExecutionResult.outputs gives them as str).
_TEXT_SUFFIXES = ("+json", "+xml")
_TEXT_TYPES = frozenset({"application/json", "application/javascript", "image/svg+xml"})


def _is_text(mime_type: str) -> bool:
    return (
        mime_type.startswith("text/")
        or mime_type in _TEXT_TYPES
        or mime_type.endswith(_TEXT_SUFFIXES)
    )


class RichOutputs:
    """The OUTPUT frames of one execution, assembled: BEGIN (with the type) ... END, one output
    at a time, within the count and size limits. `feed` returns why a frame breaks the
    protocol (the caller then ends the VM), or None."""

    def __init__(self) -> None:
        self.outputs: list[Output] = []
        self._open: tuple[str, list[bytes]] | None = None
        self._open_size = 0
        self._total = 0

    def feed(self, flags: int, mime_type: str, data: bytes) -> str | None:
        if flags & OUTPUT_BEGIN:
            if self._open is not None:
                return "an OUTPUT began before the previous one ended"
            if len(self.outputs) >= OUTPUTS_MAX:
                return f"more than {OUTPUTS_MAX} outputs"
            self._open, self._open_size = (mime_type, []), 0
        elif self._open is None:
            return "OUTPUT data outside an output"
        self._open_size += len(data)
        self._total += len(data)
        if self._open_size > OUTPUT_ITEM_MAX or self._total > OUTPUT_BYTES_MAX:
            return "outputs over their size limit"
        self._open[1].append(data)
        if flags & OUTPUT_END:
            mime, parts = self._open
            blob = b"".join(parts)
            self.outputs.append(
                Output(mime, blob.decode("utf-8", errors="replace") if _is_text(mime) else blob)
            )
            self._open = None
        return None


@dataclass
class Execution:
    """One execution in flight in a GuestVm: its two streams, their limits (stdout, stderr), its
    rich outputs and host tool calls (running ones in `calls`), and `done`, settled with
    (exit_code, flags, duration_us) or the error that ended it."""

    stdout: OutputStream
    stderr: OutputStream
    done: asyncio.Future[tuple[int, int, int]]
    limits: tuple[int, int] = (0, 0)
    tools: HostTools | None = None
    installer: InstallCall | None = None
    outputs: RichOutputs = field(default_factory=RichOutputs)
    tool_calls: list[ToolCall] = field(default_factory=list)
    # The calls running now: their task, and (name, arguments, when it started) for the log of
    # one the execution's end cuts short.
    calls: dict[asyncio.Task[None], tuple[str, bytes, float]] = field(default_factory=dict)
    tool_calls_dropped: int = field(default=0, init=False)  # calls past TOOL_CALL_LOG_MAX
    _log_text: int = field(default=0, init=False, repr=False)

    def log_call(self, record: ToolCall) -> None:
        """Add a call to the log, within its bounds (TOOL_CALL_LOG_*): past the record count a
        call is only counted, past the text budget its arguments and error are cut."""
        if len(self.tool_calls) >= TOOL_CALL_LOG_MAX:
            self.tool_calls_dropped += 1
            return
        size = len(record.arguments) + len(record.error or "")
        if self._log_text + size > TOOL_CALL_LOG_TEXT_MAX:
            record = replace(
                record,
                arguments=_cut(record.arguments),
                error=None if record.error is None else _cut(record.error),
            )
            size = len(record.arguments) + len(record.error or "")
        self._log_text += size
        self.tool_calls.append(record)


def _cut(text: str) -> str:
    if len(text) <= TOOL_CALL_LOG_CUT:
        return text
    return f"{text[:TOOL_CALL_LOG_CUT]}... ({len(text)} characters, cut)"
