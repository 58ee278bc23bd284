"""`sbx template build|list|rm`: the templates of this machine (docs/templates.md).

`build NAME --from SOURCE` makes a template of an image (a registry reference, an OCI layout
directory, an OCI or `docker save` archive); `build NAME --file Sandboxfile` of a Dockerfile-like
file (FROM, RUN, COPY, ENV, WORKDIR, USER; COPY sources relative to the file's directory or
--context). Progress and the steps' output go to stderr; the template's digest to stdout."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import InputValidationError, SandboxError, TemplateBuildError
from ..models import Template
from ..scheduler import Scheduler
from ..templates.steps import parse_sandboxfile
from .arguments import EXIT_INTERRUPTED, EXIT_USAGE


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    template = commands.add_parser("template", help="environments of your own to run code in")
    actions = template.add_subparsers(dest="template_command", required=True)
    build = actions.add_parser("build", help="build a template (a cache hit when unchanged)")
    build.add_argument("name", metavar="NAME")
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="image",
        metavar="SOURCE",
        help="an image: a registry reference, an OCI layout directory, or an OCI or "
        "`docker save` archive",
    )
    source.add_argument(
        "--file", type=Path, metavar="SANDBOXFILE", help="FROM/RUN/COPY/ENV/WORKDIR/USER steps"
    )
    build.add_argument(
        "--context",
        type=Path,
        metavar="DIR",
        help="where COPY sources are (default: the Sandboxfile's directory)",
    )
    build.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        dest="allowed_domains",
        metavar="D",
        help="a name the build's RUN steps may reach (repeatable; none by default)",
    )
    build.add_argument("-m", "--memory", type=int, help="default guest memory of its runs (MB)")
    build.add_argument("--vcpus", type=int, help="default virtual CPUs of its runs (1..8)")
    build.add_argument("-q", "--quiet", action="store_true", help="no progress or step output")
    build.add_argument("--json", action="store_true", help="print the template as JSON")
    listing = actions.add_parser("list", help="the templates of this machine")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    remove = actions.add_parser("rm", help="remove templates")
    remove.add_argument("names", nargs="+", metavar="NAME")


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_go(args))
    except KeyboardInterrupt:
        print("\nsbx: interrupted; nothing half-built was kept", file=sys.stderr)
        return EXIT_INTERRUPTED


async def _go(args: argparse.Namespace) -> int:
    async with Scheduler() as scheduler:
        if args.template_command == "list":
            templates = await scheduler.templates()
            if args.json:
                print(json.dumps([_as_json(t) for t in templates], indent=2))
            else:
                print(render(templates))
            return 0
        if args.template_command == "rm":
            status = 0
            for name in args.names:
                try:
                    removed = await scheduler.delete_template(name)
                except InputValidationError as exc:
                    print(f"sbx: {exc}", file=sys.stderr)
                    return EXIT_USAGE
                if not removed:
                    print(f"sbx: no template named {name!r}", file=sys.stderr)
                    status = 1
            return status
        return await _build(scheduler, args)


async def _build(scheduler: Scheduler, args: argparse.Namespace) -> int:
    image: str | Path | None = None
    base = "default"
    steps: list[Any] = []
    try:
        if args.file is not None:
            text = args.file.read_text()
            context = args.context if args.context is not None else args.file.parent
            start, parsed = parse_sandboxfile(text, context)
            steps = list(parsed)
            if start is None:
                raise InputValidationError(
                    f"{args.file}: a Sandboxfile starts with FROM (`FROM default` for the "
                    "default image, `FROM template:NAME`, or an image)"
                )
            image, base = _from(start)
        else:
            image = _source(args.image)
    except (OSError, InputValidationError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def progress(text: str) -> None:
        if not args.quiet:
            sys.stderr.write(text)
            sys.stderr.flush()

    started = time.monotonic()
    try:
        template = await scheduler.build_template(
            args.name,
            image=image,
            base=base,
            steps=steps,
            allowed_domains=args.allowed_domains or None,
            memory_mb=args.memory,
            vcpus=args.vcpus,
            on_progress=progress,
        )
    except InputValidationError as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TemplateBuildError as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return 1
    except SandboxError as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_as_json(template), indent=2))
    else:
        if not args.quiet:
            took = time.monotonic() - started
            print(f"sbx: template {template.name} ready ({took:.1f} s)", file=sys.stderr)
        print(template.digest)
    return 0


def _from(start: str) -> tuple[str | Path | None, str]:
    """A Sandboxfile's FROM: `default` or a template (`template:NAME`), else an image."""
    if start == "default":
        return None, "default"
    if start.startswith("template:"):
        return None, start.removeprefix("template:")
    return _source(start), "default"


def _source(value: str) -> str | Path:
    """A path when one exists there (a layout directory, an archive), else the string: a
    reference, or DIR:tag (templates/oci.py tells them apart)."""
    path = Path(value).expanduser()
    return path if path.exists() else value


def render(templates: list[Template]) -> str:
    if not templates:
        return "no templates (sbx template build NAME --from IMAGE makes one)"
    rows = [("NAME", "DIGEST", "SIZE", "LANGUAGES", "SOURCE")]
    for t in templates:
        languages = ", ".join(f"{k} {v}" for k, v in sorted(t.languages.items()))
        rows.append(
            (t.name, t.digest[:19], f"{t.size_bytes / 1e6:.0f} MB", languages or "-", t.source)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )


def _as_json(template: Template) -> dict[str, Any]:
    return dataclasses.asdict(template)
