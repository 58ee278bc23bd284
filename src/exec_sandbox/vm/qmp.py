"""A small asyncio QMP client over the socket the C core hands QEMU at fd 5.

QMP is how the host drives memory snapshots (stop, migrate, migrate-incoming, cont). QEMU is
semi-trusted (it parses guest I/O), so its replies are bounded like any other input: a line
longer than _LINE_MAX or more than _BUFFER_MAX of unparsed bytes breaks the client, and the
VM with it. Nothing here blocks the loop: the socket is non-blocking and read through
`loop.add_reader`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections import deque
from typing import Any

log = logging.getLogger("exec_sandbox")

# QMP replies we use are a few hundred bytes (query-migrate is the longest, ~1 KiB).
_LINE_MAX = 64 * 1024
# Asynchronous events QEMU may send between replies (STOP, RESUME, MIGRATION...): read and
# dropped, but at most this many per command so that a flood cannot keep a command waiting.
_EVENTS_PER_COMMAND_MAX = 1000


class QmpError(Exception):
    """QEMU refused a command, broke the QMP format, or went away."""


class QmpClient:
    """One QMP session. `await QmpClient.connect(fd)`, then `await execute(...)`.

    The fd is owned by the C Vm: this client never closes it (`close()` only stops reading).
    """

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        # A socket object for sendmsg(SCM_RIGHTS); detached on close, so the fd stays the Vm's.
        self._sock = socket.socket(fileno=fd)
        self._buf = bytearray()
        self._lines: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: QmpError | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        loop.add_reader(fd, self._on_readable)

    @classmethod
    async def connect(cls, fd: int, timeout: float) -> QmpClient:
        """Read QEMU's greeting and leave capabilities negotiation mode."""
        client = cls(fd, asyncio.get_running_loop())
        try:
            greeting = await asyncio.wait_for(client._next_message(), timeout)
            if "QMP" not in greeting:
                raise QmpError(f"unexpected QMP greeting {str(greeting)[:200]!r}")
            await client.execute("qmp_capabilities", timeout=timeout)
        except BaseException:
            client.close()
            raise
        return client

    async def execute(
        self,
        command: str,
        arguments: dict[str, Any] | None = None,
        *,
        fds: list[int] | None = None,
        timeout: float = 10.0,
    ) -> Any:
        """Run one command and return its "return" value. `fds` are passed along with the
        command (SCM_RIGHTS), e.g. for `getfd`. Raises QmpError or asyncio.TimeoutError."""
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        data = json.dumps(message).encode() + b"\n"
        async with self._lock:
            self._check()
            try:
                if fds:
                    sent = socket.send_fds(self._sock, [data], fds)
                else:
                    sent = self._sock.send(data)
            except OSError as exc:
                raise self._break(QmpError(f"QMP {command}: {exc}")) from exc
            if sent != len(data):
                # Commands are tiny; a socket that takes less than one is a QEMU not reading.
                raise self._break(QmpError(f"QMP {command}: short write"))
            try:
                reply = await asyncio.wait_for(self._next_reply(), timeout)
            except (TimeoutError, asyncio.CancelledError):
                # The command was sent: its reply may still come, and would then be taken for
                # the answer to the next command. A monitor cut short mid-command is out of
                # step for good: every later command fails instead of reading a stale reply.
                self._break(
                    QmpError(
                        f"QMP {command}: cut short before its reply; the monitor is out of step"
                    )
                )
                raise
        if "error" in reply:
            error = reply["error"]
            desc = error.get("desc") if isinstance(error, dict) else error
            raise QmpError(f"QMP {command} failed: {str(desc)[:500]}")
        return reply.get("return")

    def close(self) -> None:
        """Stop reading; the fd itself belongs to (and is closed by) the C Vm. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._sock.detach()
        self._fail(QmpError("QMP connection closed"))

    # --- internals ---

    async def _next_reply(self) -> dict[str, Any]:
        for _ in range(_EVENTS_PER_COMMAND_MAX):
            message = await self._next_message()
            if "event" in message:
                log.debug("QMP event %s", str(message.get("event"))[:64])
                continue
            if "return" in message or "error" in message:
                return message
            raise self._break(QmpError(f"unexpected QMP message {str(message)[:200]!r}"))
        raise self._break(QmpError("QEMU sent too many QMP events"))

    async def _next_message(self) -> dict[str, Any]:
        while not self._lines:
            self._check()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        line = self._lines.popleft()
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise self._break(QmpError(f"QEMU sent invalid QMP JSON: {exc}")) from None
        if not isinstance(message, dict):
            raise self._break(QmpError("QEMU sent a QMP message that is not an object"))
        return message

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, _LINE_MAX)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(QmpError(f"QMP read failed: {exc}"))
            return
        if not data:
            self._fail(QmpError("QEMU closed the QMP connection"))
            return
        self._buf += data
        while (end := self._buf.find(b"\n")) >= 0:
            if end > _LINE_MAX:
                break
            line = bytes(self._buf[:end]).strip()
            del self._buf[: end + 1]
            if line:
                self._lines.append(line)
        if len(self._buf) > _LINE_MAX or len(self._lines) > _EVENTS_PER_COMMAND_MAX:
            self._fail(QmpError("QEMU sent an over-long QMP line or too many messages"))
            return
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: QmpError) -> None:
        if self._error is None:
            self._error = error
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
            self._sock.detach()
        self._lines.clear()
        self._wake()

    def _break(self, error: QmpError) -> QmpError:
        self._fail(error)
        return error

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
