"""What the code prints while it runs, as MCP progress notifications: for a client that asked
(a progress token on its tool call), so that a long run shows signs of life before its result.
Throttled (one notification in flight, at most every INTERVAL seconds) and bounded (the tail
of the latest output); the result still carries the whole output."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from mcp.server.mcpserver import Context

from ..vm.execution import OutputCallback

log = logging.getLogger("exec_sandbox.mcp")

INTERVAL = 0.25  # seconds between two notifications
MESSAGE_MAX_CHARS = 500  # the tail of the output a notification shows


class OutputProgress:
    def __init__(self, ctx: Context[Any, Any]) -> None:
        meta = ctx.request_context.meta
        self.wanted = bool(meta) and meta.get("progress_token") is not None  # type: ignore[union-attr]
        self._ctx = ctx
        self._chars = 0  # printed so far: the progress value, which must only grow
        self._tail = ""
        self._sent_at = 0.0
        self._sending: asyncio.Task[None] | None = None

    @property
    def callback(self) -> OutputCallback | None:
        """The on_stdout/on_stderr of run()/exec(); None when the client asked for no progress
        (a callback may change how the call is made: RemoteScheduler then streams)."""
        return self._output if self.wanted else None

    def _output(self, text: str) -> None:
        self._chars += len(text)
        self._tail = (self._tail + text)[-MESSAGE_MAX_CHARS:]
        now = time.monotonic()
        if now - self._sent_at < INTERVAL or (self._sending and not self._sending.done()):
            return
        self._sent_at = now
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off the loop: this notification is skipped
            return
        self._sending = loop.create_task(self._send(self._chars, self._tail))

    async def _send(self, progress: int, message: str) -> None:
        try:
            await self._ctx.report_progress(progress, None, message)
        except Exception as exc:  # the client went away: the result will not reach it either
            log.debug("progress notification: %s", exc)

    async def finish(self) -> None:
        """Wait for the notification in flight, so that none follows the result."""
        if self._sending is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._sending
