"""`sbx session new|resume|list|delete`: sessions paused to disk (Session.pause()), so that a
shell script can keep a sandbox's variables and files from one command to the next.

`new` runs code in a fresh session and pauses it; `resume ID` runs code in the paused session and
pauses it again under a new id (the old one is deleted unless --keep: each id is a point in the
session's history). The id goes to stderr ("sbx: paused as ID"), or into --json's output."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from typing import Any

from ..config import SchedulerConfig
from ..errors import InputValidationError, SnapshotError
from ..models import ExecutionResult, SessionSnapshot
from ..scheduler import Scheduler
from ..session import Session
from ..snapshots.sessions import SessionSnapshotStore, check_id
from ..volumes import VolumeMount, parse_volume_option
from .arguments import (
    EXIT_USAGE,
    add_source_arguments,
    add_vm_options,
    exit_status,
    parse_env,
    resolve_source,
    run_command,
)


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    session = commands.add_parser("session", help="paused sessions on disk")
    actions = session.add_subparsers(dest="session_command", required=True)
    listing = actions.add_parser("list", help="the paused sessions, oldest first")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    delete = actions.add_parser("delete", help="remove paused sessions")
    delete.add_argument("ids", nargs="+", metavar="ID")
    new = actions.add_parser("new", help="run code in a new session and pause it")
    add_source_arguments(new, required=False)
    add_vm_options(
        new,
        timeout_help="the session's timeout per exec in seconds",
        env_help="environment variable of the session",
    )
    new.add_argument(
        "--volume",
        action="append",
        default=[],
        dest="volumes",
        metavar="PATH=NAME:ro",
        help="mount the volume NAME read-only at guest PATH (repeatable; the paused session "
        "keeps it from writers until its snapshot is deleted)",
    )
    new.add_argument("--json", action="store_true", help="print the result and the id as JSON")
    resume = actions.add_parser("resume", help="run code in a paused session and pause it again")
    resume.add_argument("id", metavar="ID")
    add_source_arguments(resume)
    resume.add_argument(
        "--keep",
        action="store_true",
        help="keep ID as well (default: only the new snapshot remains)",
    )
    resume.add_argument("--json", action="store_true", help="print the result and the id as JSON")


def run(args: argparse.Namespace) -> int:
    if args.session_command in ("new", "resume"):
        return _run_code(args)
    config = SchedulerConfig()
    store = SessionSnapshotStore(
        config.memory_snapshot_cache_dir / "sessions",
        ttl_seconds=config.session_snapshot_ttl_seconds,
        max_bytes=config.session_snapshot_max_mb << 20,
    )
    if args.session_command == "list":
        snapshots = asyncio.run(store.entries())
        if args.json:
            print(json.dumps([dataclasses.asdict(s) for s in snapshots], indent=2))
            return 0
        for s in snapshots:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_at))
            print(
                f"{s.id}  {s.language:10s} {s.memory_mb:5d} MB  {s.size_bytes / 1e6:7.1f} MB on "
                f"disk  {s.exec_count:4d} execs  paused {when}"
                + (f"  packages: {' '.join(s.packages)}" if s.packages else "")
            )
        return 0
    status = 0
    for snapshot_id in args.ids:
        try:
            if not asyncio.run(store.delete(check_id(snapshot_id))):
                print(f"sbx: no paused session {snapshot_id}")
                status = 1
        except SnapshotError as exc:
            print(f"sbx: {exc}")
            status = 2
    return status


def _volumes(options: list[str]) -> dict[str, VolumeMount]:
    """--volume PATH=NAME:ro of `session new`: read-only only, since the session is paused
    (a paused session cannot hold a volume read-write: docs/design.md, "Volumes")."""
    volumes = dict(parse_volume_option(option) for option in options)
    writable = [path for path, mount in volumes.items() if not mount.read_only]
    if writable:
        raise InputValidationError(
            f"sbx session new pauses its session, which can hold volumes read-only only: "
            f"add :ro ({', '.join(writable)})"
        )
    return volumes


def _run_code(args: argparse.Namespace) -> int:
    try:
        if args.session_command == "resume":
            args.language = "python"  # unused: the code runs in the snapshot's language
            check_id(args.id)
        code, language = (
            resolve_source(args) if args.file or args.code is not None else ("", "python")
        )
        language = args.language or language
        env = parse_env(args.env) if args.session_command == "new" else {}
        volumes = _volumes(args.volumes) if args.session_command == "new" else {}
    except (ValueError, SnapshotError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def go() -> int:
        stream = not args.json
        callbacks: dict[str, Any] = {
            "on_stdout": _writer(sys.stdout) if stream else None,
            "on_stderr": _writer(sys.stderr) if stream else None,
        }
        async with Scheduler() as scheduler:
            if args.session_command == "new":
                session = await scheduler.session(
                    language=language,
                    packages=args.packages or None,
                    timeout_seconds=args.timeout,
                    memory_mb=args.memory,
                    vcpus=args.vcpus,
                    disk_mb=args.disk_mb,
                    template=args.template,
                    env_vars=env or None,
                    volumes=volumes or None,
                    **callbacks,
                )
            else:
                session = await scheduler.resume(args.id, **callbacks)
            result, snapshot = await _exec_and_pause(session, code)
            if args.session_command == "resume" and not args.keep:
                await scheduler.delete_snapshot(args.id)
        _report(args, result, snapshot)
        return 0 if result is None else exit_status(result)

    return run_command(go)


async def _exec_and_pause(
    session: Session, code: str
) -> tuple[ExecutionResult | None, SessionSnapshot]:
    """The code's result (None without code), and the session paused again, whatever the
    code's exit status (a failing cell keeps the state before it, as in a notebook)."""
    try:
        result = await session.exec(code) if code else None
    except BaseException:
        await session.close()
        raise
    return result, await session.pause()


def _report(
    args: argparse.Namespace, result: ExecutionResult | None, snapshot: SessionSnapshot
) -> None:
    if args.json:
        print(
            json.dumps(
                {
                    "result": None if result is None else dataclasses.asdict(result),
                    "snapshot": dataclasses.asdict(snapshot),
                },
                indent=2,
            )
        )
    else:
        print(f"sbx: paused as {snapshot.id}", file=sys.stderr)


def _writer(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write
