"""The sessions of `sbx mcp` (exec_sandbox.mcp_server.sessions.Sandboxes): the cap, ids that are
unknown or closed since, and closing all of them. The scheduler and its sessions here are
stand-ins (plain objects with the protocol's members, no VM): this is the registry's logic."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exec_sandbox import SessionClosedError, SessionSnapshot, VmCapacityError
from exec_sandbox.mcp_server.sessions import Sandboxes, UnknownSession, owner_of, principal_of


class StandInSession:
    def __init__(self, n: int) -> None:
        self.session_id = f"s{n}"
        self.closed = False
        self.close_reason = ""
        self.exec_count = 0

    async def close(self) -> None:
        self.closed = True
        self.close_reason = "closed by the caller"

    async def pause(self) -> SessionSnapshot:
        self.closed = True
        return SessionSnapshot(f"snap-{self.session_id}", "python", 256, 0.0, 1, 0)


class StandInScheduler:
    def __init__(self) -> None:
        self.opened: list[StandInSession] = []
        self.options: list[dict[str, Any]] = []

    async def session(self, **options: Any) -> StandInSession:
        await asyncio.sleep(0)
        self.options.append(options)
        self.opened.append(StandInSession(len(self.opened)))
        return self.opened[-1]

    async def snapshots(self) -> list[SessionSnapshot]:
        ids = ["snap-elsewhere", *(f"snap-{s.session_id}" for s in self.opened)]
        return [SessionSnapshot(i, "python", 256, 0.0, 1, 0) for i in ids]

    async def resume(self, snapshot: SessionSnapshot) -> StandInSession:
        self.opened.append(StandInSession(len(self.opened)))
        return self.opened[-1]


def _sandboxes(max_sessions: int = 2, **options: Any) -> tuple[Sandboxes, StandInScheduler]:
    scheduler = StandInScheduler()
    return Sandboxes(scheduler, max_sessions=max_sessions, options=options), scheduler  # type: ignore[arg-type]


async def test_opens_past_the_cap_are_refused_also_when_concurrent() -> None:
    sandboxes, scheduler = _sandboxes(max_sessions=2)
    results = await asyncio.gather(
        *(sandboxes.open("python", None) for _ in range(3)), return_exceptions=True
    )
    assert sum(isinstance(r, VmCapacityError) for r in results) == 1
    assert len(scheduler.opened) == 2


async def test_a_session_closed_elsewhere_frees_its_place_and_says_why() -> None:
    sandboxes, scheduler = _sandboxes(max_sessions=1)
    entry = await sandboxes.open("python", None)
    scheduler.opened[0].closed = True
    scheduler.opened[0].close_reason = "idle for 300 s"
    with pytest.raises(SessionClosedError, match="idle for 300 s"):
        sandboxes.get(entry.session.session_id)
    with pytest.raises(UnknownSession):
        sandboxes.get(entry.session.session_id)
    await sandboxes.open("python", None)  # its place is free


async def test_a_session_is_its_owners_alone() -> None:
    sandboxes, _ = _sandboxes()
    entry = await sandboxes.open("python", None, owner="mcp-a")
    sid = entry.session.session_id
    assert [e.session.session_id for e in sandboxes.sessions(owner="mcp-a")] == [sid]
    assert sandboxes.sessions(owner="mcp-b") == [] and sandboxes.sessions() == []
    with pytest.raises(UnknownSession):
        sandboxes.get(sid, owner="mcp-b")
    with pytest.raises(UnknownSession):
        await sandboxes.close(sid)
    assert sandboxes.get(sid, owner="mcp-a") is entry


async def test_behind_sbx_serve_each_caller_has_its_own_cap() -> None:
    sandboxes, scheduler = _sandboxes(max_sessions=1)
    alice, bob = owner_of("conn-1", "alice"), owner_of("conn-2", "bob")
    assert (principal_of(alice), principal_of("conn-1"), principal_of(None)) == (
        "alice",
        None,
        None,
    )
    await sandboxes.open("python", None, owner=alice)
    with pytest.raises(VmCapacityError):  # alice's other connection shares her cap
        await sandboxes.open("python", None, owner=owner_of("conn-3", "alice"))
    await sandboxes.open("python", None, owner=bob)  # bob's is his own
    assert len(scheduler.opened) == 2


async def test_only_snapshots_paused_here_for_the_same_caller_resume() -> None:
    # Another snapshot of the host may be another caller's, and would come back with the
    # network it was paused with: not the model's to ask for.
    sandboxes, _ = _sandboxes(max_sessions=4)
    alice, bob = owner_of("conn-1", "alice"), owner_of("conn-2", "bob")
    entry = await sandboxes.open("python", None, owner=alice)
    snapshot = await sandboxes.pause(entry.session.session_id, owner=alice)
    with pytest.raises(UnknownSession):
        await sandboxes.resume("snap-elsewhere", owner=alice)
    with pytest.raises(UnknownSession):
        await sandboxes.resume(snapshot.id, owner=bob)
    resumed = await sandboxes.resume(snapshot.id, owner=owner_of("conn-3", "alice"))
    assert resumed.language == "python"


async def test_the_servers_options_go_with_every_session() -> None:
    sandboxes, scheduler = _sandboxes(allow_network=True)
    await sandboxes.open("raw", ["a==1"])
    assert scheduler.options == [{"allow_network": True, "language": "raw", "packages": ["a==1"]}]


async def test_close_all_closes_every_open_session() -> None:
    sandboxes, scheduler = _sandboxes()
    await sandboxes.open("python", None)
    await sandboxes.open("python", None)
    await sandboxes.close_all()
    assert all(s.closed for s in scheduler.opened)
    assert sandboxes.sessions() == []
