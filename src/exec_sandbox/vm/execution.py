"""One execution in a guest, as the host sees it: the request (`ExecRequest`), its output
streams while it runs (`OutputStream`) and what the guest reported at its end (`ExecOutcome`).
`results.py` turns an outcome into the API's ExecutionResult."""

from __future__ import annotations

import asyncio
import codecs
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from ..models import Language

OutputCallback = Callable[[str], None]


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


@dataclass
class ExecOutcome:
    stdout: str
    stderr: str
    exit_code: int
    flags: int
    duration_us: int


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


@dataclass
class Execution:
    """One execution in flight in a GuestVm: its two streams, their limits (stdout, stderr), and
    `done`, settled with (exit_code, flags, duration_us) or the error that ended it."""

    stdout: OutputStream
    stderr: OutputStream
    done: asyncio.Future[tuple[int, int, int]]
    limits: tuple[int, int] = (0, 0)
