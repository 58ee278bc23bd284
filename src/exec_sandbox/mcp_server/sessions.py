"""The sessions one MCP server opened for its clients, by id: at most `max_sessions` open at once
(each is a VM holding memory), closed together when the server stops (the client went away:
stdio's EOF, SIGTERM, the HTTP app's shutdown). A session the scheduler closed on its own (idle
timeout, a dead VM) is dropped at its next use with the reason.

Each session belongs to the client connection that opened it (its `owner`: the MCP session id
of streamable HTTP; None over stdio, where the process has one client): another connection
neither sees it in a listing nor reaches it by its id. Behind `sbx serve` the owner also names
the caller (`principal_of(owner)`: the token's name, wire.PRINCIPAL_HEADER), and `max_sessions` is
then each caller's own cap, so that one token cannot take every session from the others."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..errors import SessionClosedError, VmCapacityError
from ..models import LanguageName, SessionSnapshot
from ..protocols import SandboxScheduler, SandboxSession
from ..run_request import RunOptions

log = logging.getLogger("exec_sandbox.mcp")

DEFAULT_MAX_SESSIONS = 8


def owner_of(connection: str | None, principal: str | None) -> str | None:
    """The owner of the sessions a connection opens: the connection, qualified by its caller."""
    if principal is None:
        return connection
    return f"{principal}\n{connection or ''}"


def principal_of(owner: str | None) -> str | None:
    """The caller part of an owner (None: no server in front, every connection shares a cap)."""
    if owner is None or "\n" not in owner:
        return None
    return owner.split("\n", 1)[0]


class UnknownSession(LookupError):
    """No open session has this id (never opened here, or closed): wire code not_found."""


@dataclass
class OpenSession:
    session: SandboxSession
    language: str
    packages: tuple[str, ...]
    opened_at: float  # time.time()
    last_used: float  # time.monotonic() of the last call
    owner: str | None  # the MCP connection's session id (None: stdio's one client)


class Sandboxes:
    """What the tools act on: the scheduler, the options every VM gets (the server's, never the
    model's: network access is the operator's decision) and the open sessions."""

    def __init__(
        self,
        scheduler: SandboxScheduler,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        options: RunOptions | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.scheduler = scheduler
        self.max_sessions = max_sessions
        self.options: RunOptions = options or {}
        self._open: dict[str, OpenSession] = {}
        # The snapshots pause() made, with the caller each belongs to: what resume() takes.
        self._paused: dict[str, str | None] = {}
        # Opens admitted but not yet registered, by caller (they count against its cap).
        self._starting: dict[str | None, int] = {}

    def run_options(self, **overrides: typing.Any) -> RunOptions:
        """The server's options with a call's own (language, packages, timeout) on top; None
        values are left to the scheduler's defaults."""
        merged = dict(self.options)
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return typing.cast(RunOptions, merged)

    def _admit(self, owner: str | None) -> None:
        self._prune()
        caller = principal_of(owner)
        held = sum(1 for e in self._open.values() if principal_of(e.owner) == caller)
        if held + self._starting.get(caller, 0) >= self.max_sessions:
            raise VmCapacityError(
                f"{self.max_sessions} sessions are open, the most this server keeps: "
                "close one (close_session) or pause one (pause_session) first"
            )

    async def open(
        self, language: LanguageName, packages: Sequence[str] | None, *, owner: str | None = None
    ) -> OpenSession:
        self._admit(owner)
        with self._opening(owner):
            session = await self.scheduler.session(
                **self.run_options(language=language, packages=list(packages or []) or None)
            )
        return self._register(session, language, tuple(packages or ()), owner)

    async def pause(self, session_id: str, *, owner: str | None = None) -> SessionSnapshot:
        """Pause owner's open session; its snapshot is then resumable by the same caller."""
        entry = self.get(session_id, owner=owner)
        snapshot = await entry.session.pause()
        self.forget(session_id)
        self._paused[snapshot.id] = principal_of(owner)
        return snapshot

    async def resume(self, snapshot_id: str, *, owner: str | None = None) -> OpenSession:
        """Resume a snapshot this server paused for the same caller. Any other snapshot of the
        host is refused: it may be another caller's (behind sbx serve), and a resumed VM gets
        the network its snapshot was paused with, which must stay the operator's choice."""
        if snapshot_id not in self._paused or self._paused[snapshot_id] != principal_of(owner):
            raise UnknownSession(
                f"no session paused by this server has the snapshot id {snapshot_id!r}"
            )
        self._admit(owner)
        with self._opening(owner):
            snapshot = await self._snapshot(snapshot_id)
            session = await self.scheduler.resume(snapshot)
        return self._register(session, snapshot.language, snapshot.packages, owner)

    @contextlib.contextmanager
    def _opening(self, owner: str | None) -> Iterator[None]:
        caller = principal_of(owner)
        self._starting[caller] = self._starting.get(caller, 0) + 1
        try:
            yield
        finally:
            self._starting[caller] -= 1

    async def _snapshot(self, snapshot_id: str) -> SessionSnapshot:
        for snapshot in await self.scheduler.snapshots():
            if snapshot.id == snapshot_id:
                return snapshot
        raise UnknownSession(f"no paused session has the snapshot id {snapshot_id!r}")

    def _register(
        self,
        session: SandboxSession,
        language: str,
        packages: tuple[str, ...],
        owner: str | None,
    ) -> OpenSession:
        entry = OpenSession(session, language, packages, time.time(), time.monotonic(), owner)
        self._open[session.session_id] = entry
        return entry

    def get(self, session_id: str, *, owner: str | None = None) -> OpenSession:
        """The open session session_id of owner, marked used. UnknownSession for an id this
        server does not hold (or another connection's); SessionClosedError (with the reason)
        for one that closed since."""
        entry = self._open.get(session_id)
        if entry is None or entry.owner != owner:
            raise UnknownSession(
                f"no open session has the id {session_id!r}: open_session gives one "
                "(list_sessions shows those open)"
            )
        if entry.session.closed:
            del self._open[session_id]
            reason = entry.session.close_reason or "closed"
            raise SessionClosedError(f"session {session_id} is closed ({reason})")
        entry.last_used = time.monotonic()
        return entry

    def forget(self, session_id: str) -> None:
        self._open.pop(session_id, None)

    async def close(self, session_id: str, *, owner: str | None = None) -> None:
        entry = self._open.get(session_id)
        if entry is None or entry.owner != owner:
            raise UnknownSession(f"no open session has the id {session_id!r}")
        del self._open[session_id]
        await entry.session.close()

    def sessions(self, *, owner: str | None = None) -> list[OpenSession]:
        self._prune()
        return [e for e in self._open.values() if e.owner == owner]

    def _prune(self) -> None:
        for session_id, entry in list(self._open.items()):
            if entry.session.closed:
                del self._open[session_id]

    async def close_all(self) -> None:
        """Close every open session (their VMs are destroyed); failures are logged, not raised:
        this runs while the server stops."""
        entries = list(self._open.values())
        self._open.clear()
        results = await asyncio.gather(
            *(e.session.close() for e in entries), return_exceptions=True
        )
        for entry, result in zip(entries, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("closing session %s: %s", entry.session.session_id, result)
