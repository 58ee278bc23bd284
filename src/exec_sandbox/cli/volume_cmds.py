"""`sbx volume create|list|rm`: the volumes of this machine (docs/design.md, "Volumes").

Volumes live in the data directory ($EXEC_SANDBOX_DATA_DIR, else $XDG_DATA_HOME/exec-sandbox,
else ~/.local/share/exec-sandbox) under volumes/. `sbx run` and `sbx session new` attach them
with `--volume /mnt/data=NAME[:ro]`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from ..config import SchedulerConfig
from ..volumes import Volume, VolumeStore
from .arguments import run_command


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    volume = commands.add_parser("volume", help="disks that outlive sandboxes")
    actions = volume.add_subparsers(dest="volume_command", required=True)
    create = actions.add_parser("create", help="create an empty volume (sparse on this host)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--size-mb", type=int, required=True, help="its size in MB")
    listing = actions.add_parser("list", help="the volumes of this machine")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    remove = actions.add_parser(
        "rm", help="delete volumes and their content (refused while attached)"
    )
    remove.add_argument("names", nargs="+", metavar="NAME")


def run(args: argparse.Namespace) -> int:
    return run_command(lambda: _go(args))


async def _go(args: argparse.Namespace) -> int:
    # The store alone: no VM is started, so no Scheduler (and no images) is needed.
    config = SchedulerConfig()
    store = VolumeStore.beside_sessions(
        config.volume_dir, config.memory_snapshot_cache_dir / "sessions"
    )
    if args.volume_command == "create":
        volume = await store.create(args.name, args.size_mb)
        print(volume.name)
        return 0
    if args.volume_command == "list":
        volumes = await store.list()
        if args.json:
            print(json.dumps([dataclasses.asdict(v) for v in volumes], indent=2))
        else:
            print(render(volumes))
        return 0
    status = 0
    for name in args.names:
        if not await store.delete(name):
            print(f"sbx: no volume {name!r}", file=sys.stderr)
            status = 1
    return status


def render(volumes: list[Volume]) -> str:
    if not volumes:
        return "no volumes (sbx volume create NAME --size-mb N makes one)"
    rows = [("NAME", "SIZE", "CREATED")]
    for v in volumes:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.created_at))
        rows.append((v.name, f"{v.size_mb} MB", created))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
