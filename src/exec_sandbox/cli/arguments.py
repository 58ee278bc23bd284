"""What the `sbx` commands that run code share: where the code comes from, its environment, and
how an outcome becomes an exit status (the code's own; 124 timed out, 125 the sandbox failed, 2
bad arguments)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..config import SchedulerConfig
from ..errors import (
    InputValidationError,
    OutputLimitError,
    SandboxError,
    VmConfigError,
    VolumeError,
)
from ..models import LANGUAGE_NAMES, ExecutionResult, Language, LanguageName
from ..validation import validate_language

EXIT_TIMEOUT = 124
EXIT_SANDBOX_FAILURE = 125
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_EXTENSIONS: dict[str, LanguageName] = {
    ".py": "python",
    ".js": "javascript",
    ".cjs": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".sh": "raw",
    ".bash": "raw",
}


def add_source_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument("file", nargs="?", help="file to run (language from its extension)")
    source.add_argument("-c", "--code", help="code to run")


def add_vm_options(parser: argparse.ArgumentParser, *, timeout_help: str, env_help: str) -> None:
    """What `sbx run` and `sbx session new` both take for the VM they start: -l, -t, -m,
    --vcpus, --disk-mb, --template, -e, -p."""
    parser.add_argument(
        "-l",
        "--language",
        choices=LANGUAGE_NAMES,
        help="typescript (or ts) runs as javascript, its types stripped",
    )
    parser.add_argument("-t", "--timeout", type=int, help=timeout_help)
    parser.add_argument("-m", "--memory", type=int, help="guest memory in MB (>= 128)")
    parser.add_argument("--vcpus", type=int, help="virtual CPUs of the VM (1..8, default 1)")
    parser.add_argument(
        "--disk-mb",
        type=int,
        metavar="MB",
        help="size of the VM's disk for /home/user and /tmp (64..1048576, default 4096; "
        "sparse: costs only what is written)",
    )
    parser.add_argument(
        "--template", metavar="NAME", help="run in this template (see `sbx template list`)"
    )
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VALUE", help=env_help
    )
    parser.add_argument(
        "-p",
        "--package",
        action="append",
        default=[],
        dest="packages",
        metavar="PKG==VER",
        help="a package to install: name==version for python, "
        "name@version for javascript (repeatable)",
    )


def add_scheduler_options(parser: argparse._ActionsContainer) -> None:
    """The Scheduler's own settings, for the commands that keep one running (sbx serve, sbx
    mcp): scheduler_config() reads them back."""
    parser.add_argument("--warm-pool", type=int, metavar="N", help="idle VMs kept per language")
    parser.add_argument("--max-vms", type=int, metavar="N", help="VMs of this host at once")
    parser.add_argument("--memory", type=int, metavar="MB", help="default guest memory")
    parser.add_argument("--timeout", type=int, metavar="S", help="default timeout of a call")
    parser.add_argument(
        "--session-idle-timeout", type=int, metavar="S", help="idle sessions end after S seconds"
    )
    parser.add_argument(
        "--no-memory-snapshots",
        action="store_true",
        help="boot every VM cold (no L1 memory snapshots)",
    )


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The SchedulerConfig of add_scheduler_options()' flags; VmConfigError for bad values."""
    settings: dict[str, Any] = {}
    for flag, field in (
        ("warm_pool", "warm_pool_size"),
        ("max_vms", "max_concurrent_vms"),
        ("memory", "default_memory_mb"),
        ("timeout", "default_timeout_seconds"),
        ("session_idle_timeout", "session_idle_timeout_seconds"),
    ):
        if getattr(args, flag) is not None:
            settings[field] = getattr(args, flag)
    if args.no_memory_snapshots:
        settings["memory_snapshots"] = False
    return SchedulerConfig(**settings)


def resolve_source(args: argparse.Namespace) -> tuple[str, Language]:
    """The code and its language (the runtime: TypeScript runs as javascript): -c (python unless
    -l), or a file (language from -l or its extension). ValueError says what is wrong."""
    name = getattr(args, "language", None)
    if args.code is not None:
        return args.code, validate_language(name or "python")
    path = Path(args.file)
    name = name or _EXTENSIONS.get(path.suffix)
    if name is None:
        raise ValueError(f"cannot tell the language of {path.name}: pass -l")
    language = validate_language(name)
    try:
        return path.read_text(encoding="utf-8"), language
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"-e expects KEY=VALUE, got {pair!r}")
        env[name] = value
    return env


def exit_status(result: ExecutionResult) -> int:
    return EXIT_TIMEOUT if result.exit_code == -1 else result.exit_code


def run_command(command: Callable[[], Awaitable[int]]) -> int:
    """asyncio.run(command()), with the library's failures turned into messages and statuses."""
    try:
        return asyncio.run(command())  # type: ignore[arg-type]
    # A --volume naming no volume (or one of another size) is the caller's mistake, like an
    # unknown --template: a usage error, not the sandbox failing.
    except (InputValidationError, VmConfigError, VolumeError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FileNotFoundError as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_FAILURE
    except OutputLimitError as exc:
        print(f"sbx: output limit: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_FAILURE
    except SandboxError as exc:
        print(f"sbx: sandbox failure ({type(exc).__name__}): {exc}", file=sys.stderr)
        return EXIT_SANDBOX_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
