"""The server's sessions and who may use them (docs/server.md, "Security model").

Every session belongs to the principal that opened it (a token's name; `local` on the Unix
socket). Others get not_found, exactly as for an id that does not exist, unless the owner
shared it; an admin sees every one. Per-token limits (open sessions, VMs: sessions plus runs
in flight) are checked here, before the Scheduler's own admission, and counted before the
first await so that concurrent requests cannot overshoot them.

Paused sessions (snapshots) belong to their session's owner: `snapshots.json` in the state
directory records owner and shared_with by snapshot id. At shutdown (`--on-shutdown pause`)
every open session is paused and recorded with its server id; the next server answers that id
again and resumes the snapshot on its first use, so a client keeps using the same session id
across a restart (its variables and files intact, its running processes too)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from .. import wire
from ..errors import InputValidationError, SnapshotError
from ..models import ExecutionResult, SessionSnapshot
from ..run_request import RunOptions
from ..scheduler import Scheduler
from ..session import Session
from .grants import NotGranted, check, check_needs, needs_of
from .statefile import read_json, set_aside, write_json
from .tokens import Principal

log = logging.getLogger(__name__)

OnShutdown = Literal["pause", "close"]
# Closed sessions stay listed (with close_reason) until this many newer ones closed.
_KEEP_CLOSED = 256
# A pause at shutdown that takes longer than this is given up: the session is closed.
_SHUTDOWN_PAUSE_SECONDS = 120.0
_MAX_SHARED_WITH = 64


class HubError(Exception):
    """An answer of the server's own (wire.SERVER_CODES): not_found, forbidden, ..."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def not_found(what: str) -> HubError:
    return HubError(wire.NOT_FOUND, f"no {what}")


@dataclasses.dataclass
class Entry:
    """One session the server serves under `id` (the Session's session_id, or the id it had
    before a restart)."""

    id: str
    session: Session
    owner: str
    shared_with: tuple[str, ...]
    created_at: float
    # What its options asked of its owner's grants (grants.needs_of): a fork asks it again.
    needs: dict[str, Any] | None = None


@dataclasses.dataclass
class _Dormant:
    """A session paused at the last shutdown: woken by its first use."""

    id: str
    snapshot_id: str
    owner: str
    shared_with: tuple[str, ...]
    language: str
    created_at: float
    exec_count: int
    needs: dict[str, Any] | None = None


class Hub:
    def __init__(
        self,
        scheduler: Scheduler,
        state_dir: Path,
        *,
        on_shutdown: OnShutdown = "pause",
        max_sessions_per_token: int | None = None,
        max_vms_per_token: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.on_shutdown = on_shutdown
        self.max_sessions_per_token = max_sessions_per_token
        self.max_vms_per_token = max_vms_per_token
        self._records_path = state_dir / "snapshots.json"
        self._entries: dict[str, Entry] = {}
        self._dormant: dict[str, _Dormant] = {}
        self._waking: dict[str, asyncio.Lock] = {}
        # Reservations not yet a session in _entries (opening, resuming, forking), and VMs of
        # runs in flight, by principal.
        self._pending_sessions: dict[str, int] = {}
        self._runs: dict[str, int] = {}
        # Work that outlives its request (an exec whose client went away): finished or
        # cancelled at shutdown.
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False

    # --- start and stop ---

    async def start(self) -> None:
        """Check snapshots.json, then find the sessions the last server paused at its
        shutdown. A damaged file is set aside (renamed, kept), not overwritten by the next
        record; records of snapshots that no longer exist (deleted or evicted while no server
        ran) are dropped."""
        try:
            records = read_json(self._records_path)
            if not isinstance(records, dict | None) or not all(
                isinstance(r, dict) for r in (records or {}).values()
            ):
                raise ValueError("not an object of records")
        except ValueError as exc:
            moved = set_aside(self._records_path)
            log.warning("%s is damaged (%s): set aside as %s", self._records_path, exc, moved)
            records = None
        if records:
            try:
                present = {s.id for s in await self.scheduler.snapshots()}
            except Exception as exc:  # the store unreadable: keep the records as they are
                log.warning("cannot list snapshots to prune %s: %s", self._records_path, exc)
            else:
                kept = {k: v for k, v in records.items() if k in present}
                if len(kept) != len(records):
                    write_json(self._records_path, kept)
        for snapshot_id, rec in self._records().items():
            if rec.get("at_shutdown") and isinstance(rec.get("session_id"), str):
                self._dormant[rec["session_id"]] = _Dormant(
                    id=rec["session_id"],
                    snapshot_id=snapshot_id,
                    owner=str(rec.get("owner", "")),
                    shared_with=tuple(rec.get("shared_with", ())),
                    language=str(rec.get("language", "")),
                    created_at=float(rec.get("created_at", 0.0)),
                    exec_count=int(rec.get("exec_count", 0)),
                    needs=rec.get("needs"),
                )

    async def shutdown(self) -> None:
        """Pause (or close) every open session, as configured. The scheduler is closed by its
        owner afterwards."""
        self._closing = True
        for task in list(self._background):
            task.cancel()
        open_entries = [e for e in self._entries.values() if not e.session.closed]
        if self.on_shutdown == "pause":
            await asyncio.gather(*(self._pause_for_restart(e) for e in open_entries))
        else:
            await asyncio.gather(*(e.session.close() for e in open_entries))

    async def _pause_for_restart(self, entry: Entry) -> None:
        try:
            snapshot = await asyncio.wait_for(entry.session.pause(), _SHUTDOWN_PAUSE_SECONDS)
        except Exception as exc:
            log.warning("session %s could not be paused at shutdown: %s", entry.id, exc)
            await entry.session.close()
            return
        self._record(
            snapshot,
            entry.owner,
            entry.shared_with,
            entry.needs,
            session_id=entry.id,
            since=entry.created_at,
        )

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Let task run after its request ended (until it finishes or the server stops)."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- visibility ---

    @staticmethod
    def _may_see(principal: Principal, owner: str, shared_with: Sequence[str]) -> bool:
        return principal.admin or principal.name == owner or principal.name in shared_with

    def sessions(self, principal: Principal) -> list[dict[str, Any]]:
        """SessionInfo of every session principal can see, oldest first (the dormant ones of
        the last shutdown too: they wake on first use)."""
        infos = [
            self.info(e)
            for e in self._entries.values()
            if self._may_see(principal, e.owner, e.shared_with)
        ]
        infos += [
            self._dormant_info(d)
            for d in self._dormant.values()
            if self._may_see(principal, d.owner, d.shared_with)
        ]
        return sorted(infos, key=lambda i: float(i["created_at"]))

    async def get(self, principal: Principal, session_id: str) -> Entry:
        """The session of that id if principal may see it, else not_found (never forbidden:
        whether another token's session exists does not leak)."""
        entry = self._entries.get(session_id)
        if entry is None and session_id in self._dormant:
            dormant = self._dormant[session_id]
            if self._may_see(principal, dormant.owner, dormant.shared_with):
                entry = await self._wake(principal, dormant)
        if entry is None or not self._may_see(principal, entry.owner, entry.shared_with):
            raise not_found(f"session {session_id}")
        if not principal.admin and principal.name != entry.owner:
            # Sharing lends the session, not its owner's grants: a token it is shared with
            # uses it only if its own grants cover what the session has (network, ports,
            # secrets, volumes), checked at each use (grants change, names get tokens later).
            granted_needs(principal, entry.needs)
        return entry

    # --- runs and sessions ---

    async def run(self, principal: Principal, code: str, options: RunOptions) -> ExecutionResult:
        options = granted(principal, options)
        with self._reserve(principal, sessions=0, vms=1):
            return await self.scheduler.run(code, **options)

    async def open_session(self, principal: Principal, options: RunOptions) -> Entry:
        options = granted(principal, options)
        with self._reserve(principal, sessions=1, vms=1):
            session = await self.scheduler.session(**options)
            return self._add(session, principal.name, (), needs_of(options))

    async def close_session(self, principal: Principal, session_id: str) -> None:
        dormant = self._dormant.get(session_id)
        if dormant is not None and self._may_see(principal, dormant.owner, dormant.shared_with):
            # Paused at the last shutdown: closing it is forgetting it, no VM to start for that.
            self._dormant.pop(session_id, None)
            await self.scheduler.delete_snapshot(dormant.snapshot_id)
            self._forget(dormant.snapshot_id)
            return
        entry = await self.get(principal, session_id)
        await entry.session.close()
        self._entries.pop(entry.id, None)

    async def share(self, principal: Principal, session_id: str, names: Any) -> Entry:
        entry = await self.get(principal, session_id)
        if not (principal.admin or principal.name == entry.owner):
            # Someone it is shared with may use it, not pass it on.
            raise HubError(wire.FORBIDDEN, "only the session's owner (or an admin) shares it")
        if (
            not isinstance(names, list)
            or len(names) > _MAX_SHARED_WITH
            or not all(isinstance(n, str) and 0 < len(n) <= 64 for n in names)
        ):
            raise InputValidationError(
                f"shared_with is a list of at most {_MAX_SHARED_WITH} token names"
            )
        entry.shared_with = tuple(dict.fromkeys(n for n in names if n != entry.owner))
        return entry

    async def pause(self, principal: Principal, session_id: str) -> SessionSnapshot:
        entry = await self.get(principal, session_id)
        snapshot = await entry.session.pause()
        self._record(snapshot, entry.owner, entry.shared_with, entry.needs)
        return snapshot

    async def fork(self, principal: Principal, session_id: str, count: int | None) -> list[Entry]:
        entry = await self.get(principal, session_id)
        self._may_copy(principal, entry.owner, "fork")
        granted_needs(principal, entry.needs)
        n = count if isinstance(count, int) and not isinstance(count, bool) else 1
        if n < 1:
            raise InputValidationError("count must be an integer from 1 to 16")
        # The copies count against the session's owner, whose they are.
        owner = dataclasses.replace(principal, name=entry.owner)
        with self._reserve(owner, sessions=n, vms=n):
            forks = await entry.session.fork(count)
            sessions = forks if isinstance(forks, list) else [forks]
            return [self._add(s, entry.owner, entry.shared_with, entry.needs) for s in sessions]

    # --- snapshots ---

    async def snapshots(self, principal: Principal) -> list[SessionSnapshot]:
        records = self._records()
        visible = []
        for snapshot in await self.scheduler.snapshots():
            rec = records.get(snapshot.id)
            if rec is None:
                # Made by another process of this user (`sbx session new`): the admin's.
                if principal.admin:
                    visible.append(snapshot)
            elif self._may_see(principal, rec.get("owner", ""), rec.get("shared_with", ())):
                visible.append(snapshot)
        return visible

    async def _visible_snapshot(self, principal: Principal, snapshot_id: str) -> dict[str, Any]:
        rec = self._records().get(snapshot_id)
        if rec is None:
            if principal.admin:
                return {"owner": principal.name, "shared_with": []}
            raise not_found(f"snapshot {snapshot_id}")
        if not self._may_see(principal, rec.get("owner", ""), rec.get("shared_with", ())):
            raise not_found(f"snapshot {snapshot_id}")
        return rec

    async def delete_snapshot(self, principal: Principal, snapshot_id: str) -> None:
        await self._visible_snapshot(principal, snapshot_id)
        if not await self.scheduler.delete_snapshot(snapshot_id):
            raise not_found(f"snapshot {snapshot_id}")
        self._forget(snapshot_id)

    async def resume(self, principal: Principal, snapshot_id: str) -> Entry:
        rec = await self._visible_snapshot(principal, snapshot_id)
        owner = str(rec.get("owner") or principal.name)
        self._may_copy(principal, owner, "resume")
        granted_needs(principal, rec.get("needs"))
        shared = tuple(rec.get("shared_with", ()))
        with self._reserve(dataclasses.replace(principal, name=owner), sessions=1, vms=1):
            try:
                session = await self.scheduler.resume(snapshot_id)
            except SnapshotError as exc:
                if "no session snapshot" in str(exc) or "not a session snapshot id" in str(exc):
                    raise not_found(f"snapshot {snapshot_id}") from None
                raise
            return self._add(session, owner, shared, rec.get("needs"))

    async def _wake(self, principal: Principal, dormant: _Dormant) -> Entry:
        """Resume a session of the last shutdown under its old id (one waker per id). It counts
        against its owner's limits again (the owner's own numbers when the owner wakes it, the
        server's defaults otherwise)."""
        lock = self._waking.setdefault(dormant.id, asyncio.Lock())
        async with lock:
            if dormant.id in self._entries:
                return self._entries[dormant.id]
            owner = (
                principal
                if principal.name == dormant.owner
                else Principal(dormant.owner, frozenset())
            )
            try:
                with self._reserve(owner, sessions=1, vms=1):
                    session = await self.scheduler.resume(dormant.snapshot_id)
            except SnapshotError:
                # Evicted or damaged since: the session is lost, said once, then not_found.
                self._dormant.pop(dormant.id, None)
                self._forget(dormant.snapshot_id)
                raise
            entry = Entry(
                dormant.id,
                session,
                dormant.owner,
                dormant.shared_with,
                time.time(),
                dormant.needs,
            )
            entry.created_at = dormant.created_at
            self._entries[dormant.id] = entry
            self._dormant.pop(dormant.id, None)
            # The live session is the state now; its snapshot would only be a stale copy.
            await self.scheduler.delete_snapshot(dormant.snapshot_id)
            self._forget(dormant.snapshot_id)
            return entry

    # --- SessionInfo ---

    def info(self, entry: Entry) -> dict[str, Any]:
        session = entry.session
        self._note_idle_pause(entry)
        return {
            "id": entry.id,
            "language": session.language,
            "owner": entry.owner,
            "shared_with": list(entry.shared_with),
            "exec_count": session.exec_count,
            "closed": session.closed,
            "close_reason": session.close_reason,
            "installed": list(session.installed),
            "exposed_ports": wire.encode(session.exposed_ports),
            "created_at": entry.created_at,
        }

    @staticmethod
    def _dormant_info(d: _Dormant) -> dict[str, Any]:
        return {
            "id": d.id,
            "language": d.language,
            "owner": d.owner,
            "shared_with": list(d.shared_with),
            "exec_count": d.exec_count,
            "closed": False,
            "close_reason": "",
            "installed": [],
            "exposed_ports": [],
            "created_at": d.created_at,
        }

    def _note_idle_pause(self, entry: Entry) -> None:
        """A session that paused itself when idle (session_idle_action="pause"): its snapshot
        is its owner's, like one paused on request."""
        snapshot = entry.session.paused_as
        if snapshot is not None and snapshot.id not in self._records():
            self._record(snapshot, entry.owner, entry.shared_with, entry.needs)

    # --- limits ---

    @staticmethod
    def _may_copy(principal: Principal, owner: str, what: str) -> None:
        """A new session from another's (a fork, a resume) is its owner's and counts against
        the owner's limits: only the owner (or an admin) makes one, so that a token a session
        is shared with can neither spend the owner's quota nor get sessions past its own."""
        if principal.name != owner and not principal.admin:
            raise HubError(wire.FORBIDDEN, f"only the session's owner may {what} it")

    def _limits(self, principal: Principal) -> tuple[int | None, int | None]:
        sessions = principal.max_sessions
        vms = principal.max_vms
        return (
            self.max_sessions_per_token if sessions is None else sessions,
            self.max_vms_per_token if vms is None else vms,
        )

    def usage(self, principal: Principal) -> tuple[int, int]:
        """(open sessions, VMs) of principal: its sessions and reservations, plus its runs."""
        name = principal.name
        sessions = sum(
            1 for e in self._entries.values() if e.owner == name and not e.session.closed
        ) + self._pending_sessions.get(name, 0)
        return sessions, sessions + self._runs.get(name, 0)

    def limits(self, principal: Principal) -> dict[str, Any]:
        max_sessions, max_vms = self._limits(principal)
        sessions, vms = self.usage(principal)
        return {
            "max_sessions": max_sessions,
            "max_vms": max_vms,
            "sessions": sessions,
            "vms": vms,
        }

    @contextlib.contextmanager
    def _reserve(self, principal: Principal, *, sessions: int, vms: int) -> Any:
        if self._closing:
            raise HubError(wire.INTERNAL, "the server is shutting down")
        max_sessions, max_vms = self._limits(principal)
        open_sessions, open_vms = self.usage(principal)
        if max_sessions is not None and sessions and open_sessions + sessions > max_sessions:
            raise HubError(
                wire.LIMIT_EXCEEDED,
                f"token {principal.name!r} has {open_sessions} open sessions of its {max_sessions}",
            )
        if max_vms is not None and open_vms + vms > max_vms:
            raise HubError(
                wire.LIMIT_EXCEEDED,
                f"token {principal.name!r} has {open_vms} VMs of its {max_vms}",
            )
        name = principal.name
        table = self._pending_sessions if sessions else self._runs
        count = sessions or vms
        table[name] = table.get(name, 0) + count
        try:
            yield
        finally:
            table[name] -= count
            if not table[name]:
                del table[name]

    # --- the table ---

    def _add(
        self,
        session: Session,
        owner: str,
        shared_with: tuple[str, ...],
        needs: dict[str, Any] | None,
    ) -> Entry:
        entry = Entry(session.session_id, session, owner, shared_with, time.time(), needs)
        self._entries[entry.id] = entry
        closed = [e for e in self._entries.values() if e.session.closed]
        for old in closed[: max(0, len(closed) - _KEEP_CLOSED)]:
            del self._entries[old.id]
        return entry

    # --- snapshots.json: snapshot id -> owner, shared_with (and the session id at shutdown) ---

    def _records(self) -> dict[str, dict[str, Any]]:
        try:
            data = read_json(self._records_path)
        except ValueError as exc:
            log.warning("ignoring %s: %s", self._records_path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def _record(
        self,
        snapshot: SessionSnapshot,
        owner: str,
        shared_with: tuple[str, ...],
        needs: dict[str, Any] | None,
        *,
        session_id: str | None = None,
        since: float | None = None,
    ) -> None:
        records = self._records()
        records[snapshot.id] = {
            "owner": owner,
            "shared_with": list(shared_with),
            "language": snapshot.language,
            "created_at": snapshot.created_at if since is None else since,
            "exec_count": snapshot.exec_count,
            **({"needs": needs} if needs is not None else {}),
            **({"session_id": session_id, "at_shutdown": True} if session_id else {}),
        }
        write_json(self._records_path, records)

    def _forget(self, snapshot_id: str) -> None:
        records = self._records()
        if records.pop(snapshot_id, None) is not None:
            write_json(self._records_path, records)


def granted(principal: Principal, options: RunOptions) -> RunOptions:
    """options if principal's grants allow them (volumes granted read-only made read-only),
    else forbidden naming the option and the grant; before anything is reserved or started."""
    try:
        return check(principal.grants, options, principal.name)
    except NotGranted as exc:
        raise HubError(wire.FORBIDDEN, str(exc)) from None


def granted_needs(principal: Principal, needs: Any) -> None:
    """forbidden when a copy of a session (fork, resume) would exceed principal's grants."""
    try:
        check_needs(principal.grants, needs, principal.name)
    except NotGranted as exc:
        raise HubError(wire.FORBIDDEN, str(exc)) from None


def run_options(body: Any, *, exclude: Callable[[str], bool] = lambda _: False) -> RunOptions:
    """run()/session() options of a JSON body (wire.options_from_wire), `code` and whatever
    exclude names left out."""
    if not isinstance(body, dict):
        raise HubError(wire.BAD_REQUEST, "the body must be a JSON object")
    return wire.options_from_wire({k: v for k, v in body.items() if not exclude(k)})
