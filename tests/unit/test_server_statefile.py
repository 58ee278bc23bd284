"""snapshots.json when `sbx serve` starts (Hub.start), no VM (a stand-in scheduler that only
lists snapshots): records of snapshots that are gone are dropped, a damaged file is set aside
(renamed and kept), not overwritten, and the server starts either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from exec_sandbox.scheduler import Scheduler
from exec_sandbox.server.hub import Hub


class _Snapshots:
    """A stand-in for the Scheduler: the snapshots the store holds, by id."""

    def __init__(self, *ids: str) -> None:
        self.ids = ids

    async def snapshots(self) -> list[Any]:
        return [type("Snap", (), {"id": i})() for i in self.ids]


def _hub(tmp_path: Path, *present: str) -> Hub:
    return Hub(cast(Scheduler, _Snapshots(*present)), tmp_path)


def _record(owner: str, **extra: Any) -> dict[str, Any]:
    return {"owner": owner, "shared_with": [], "language": "python", "created_at": 1.0, **extra}


async def test_records_of_gone_snapshots_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "snapshots.json"
    at_shutdown = {"session_id": "s-gone", "at_shutdown": True}
    path.write_text(
        json.dumps(
            {
                "kept": _record("alice"),
                "gone": _record("bob"),
                "gone-dormant": _record("bob", **at_shutdown),
                "kept-dormant": _record("carol", session_id="s-kept", at_shutdown=True),
            }
        )
    )
    hub = _hub(tmp_path, "kept", "kept-dormant", "unrecorded")
    await hub.start()
    assert set(json.loads(path.read_text())) == {"kept", "kept-dormant"}
    assert set(hub._dormant) == {"s-kept"}


async def test_a_damaged_file_is_set_aside_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "snapshots.json"
    for damaged in ('{"half": ', '["not", "records"]', '{"x": 5}'):
        path.write_text(damaged)
        await _hub(tmp_path, "x").start()
        assert not path.exists()
        (aside,) = tmp_path.glob("snapshots.json.damaged-*")
        assert aside.read_text() == damaged
        aside.unlink()


async def test_no_file_is_no_change(tmp_path: Path) -> None:
    await _hub(tmp_path).start()
    assert list(tmp_path.iterdir()) == []
