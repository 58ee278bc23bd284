"""`sbx session list|delete`: the paused sessions of this user (Session.pause())."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from .config import SchedulerConfig
from .errors import SnapshotError
from .session_snapshots import SessionSnapshotStore, check_id


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    session = commands.add_parser("session", help="paused sessions on disk")
    actions = session.add_subparsers(dest="session_command", required=True)
    listing = actions.add_parser("list", help="the paused sessions, oldest first")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    delete = actions.add_parser("delete", help="remove paused sessions")
    delete.add_argument("ids", nargs="+", metavar="ID")


def run(args: argparse.Namespace) -> int:
    config = SchedulerConfig()
    store = SessionSnapshotStore(config.memory_snapshot_cache_dir / "sessions",
                                 ttl_seconds=config.session_snapshot_ttl_seconds,
                                 max_bytes=config.session_snapshot_max_mb << 20)  # fmt: skip
    if args.session_command == "list":
        snapshots = store.entries()
        if args.json:
            print(json.dumps([dataclasses.asdict(s) for s in snapshots], indent=2))
            return 0
        for s in snapshots:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_at))
            print(f"{s.id}  {s.language:10s} {s.memory_mb:5d} MB  {s.size_bytes / 1e6:7.1f} MB on "
                  f"disk  {s.exec_count:4d} execs  paused {when}"
                  + (f"  packages: {' '.join(s.packages)}" if s.packages else ""))
        return 0
    status = 0
    for snapshot_id in args.ids:
        try:
            if not store.delete(check_id(snapshot_id)):
                print(f"sbx: no paused session {snapshot_id}")
                status = 1
        except SnapshotError as exc:
            print(f"sbx: {exc}")
            status = 2
    return status
