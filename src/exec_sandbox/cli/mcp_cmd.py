"""`sbx mcp`: the sandbox as an MCP server on stdin/stdout (docs/mcp.md), for an MCP client
(a desktop or IDE agent) that starts it as a subprocess. Its VMs run on this host's Scheduler,
or with --server on a `sbx serve` through RemoteScheduler. stdout is the protocol: everything
else (logs, errors) goes to stderr. It exits when its stdin ends or on SIGTERM, closing every
session the client left open."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..config import SchedulerConfig
from ..errors import InputValidationError, VmConfigError
from ..network.request import parse_network_request
from ..protocols import SandboxScheduler
from ..run_request import RunOptions
from .arguments import EXIT_USAGE, add_scheduler_options, run_command, scheduler_config

# As exec_sandbox.mcp_server.SchedulerFactory (not imported: it needs the [server] extra).
SchedulerFactory = Callable[[], AbstractAsyncContextManager[SandboxScheduler]]
# The scheduler options a remote server decides for itself.
_LOCAL_ONLY = ("warm_pool", "max_vms", "memory", "timeout", "no_memory_snapshots")


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mcp = commands.add_parser(
        "mcp",
        help="serve the sandbox as MCP tools on stdin/stdout",
        description="An MCP server over stdio: tools to run code, open sessions, exec in "
        "them, read and write their files, pause and resume them.",
    )
    mcp.add_argument(
        "--server",
        metavar="SOCKET_OR_URL",
        help="run the VMs on a `sbx serve` (its Unix socket path or http(s) URL) instead of "
        "this host",
    )
    mcp.add_argument(
        "--token-env",
        metavar="VAR",
        help="the environment variable holding the bearer token for --server over TCP",
    )
    mcp.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        metavar="N",
        help="sessions the client may have open at once (default 8)",
    )
    mcp.add_argument(
        "--network",
        action="store_true",
        help="let the code connect out by name (any public name, or --allow-domain)",
    )
    mcp.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        dest="allowed_domains",
        metavar="D",
        help="allow this name and its subdomains; implies --network",
    )
    local = mcp.add_argument_group("this host's scheduler (without --server)")
    add_scheduler_options(local)
    mcp.add_argument("--debug", action="store_true", help="debug logging (on stderr)")


def run(args: argparse.Namespace) -> int:
    try:
        factory = _scheduler_factory(args)
        options = _options(args)
        max_sessions = args.max_sessions if args.max_sessions is not None else 8
        if max_sessions < 1:
            raise ValueError("--max-sessions must be at least 1")
    except (ValueError, InputValidationError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        from ..mcp_server import serve_stdio
    except ImportError as exc:
        print(
            f"sbx: `sbx mcp` needs the MCP SDK: pip install 'exec-sandbox[server]' ({exc})",
            file=sys.stderr,
        )
        return EXIT_USAGE

    async def go() -> int:
        if not await serve_stdio(factory, max_sessions=max_sessions, options=options):
            # SIGTERM: the sessions and the scheduler are closed; the SDK's stdin reader thread
            # may wait in read() forever, and the interpreter would wait for it.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0

    return run_command(go)


def _options(args: argparse.Namespace) -> RunOptions:
    """What every VM of the server gets: network access is decided here, by whoever starts
    the server, never by the model."""
    network = args.network or bool(args.allowed_domains)
    # Checked now, so that a bad name is a usage error before any VM starts.
    parse_network_request(network, args.allowed_domains or None, None, None)
    options: dict[str, Any] = {}
    if network:
        options["allow_network"] = True
        if args.allowed_domains:
            options["allowed_domains"] = list(args.allowed_domains)
    return options  # type: ignore[return-value]


def _scheduler_factory(args: argparse.Namespace) -> SchedulerFactory:
    """What gives the scheduler: a RemoteScheduler of --server, else this host's Scheduler of
    the scheduler options."""
    if args.server:
        given = [f"--{name.replace('_', '-')}" for name in _LOCAL_ONLY if getattr(args, name)]
        if given:
            raise ValueError(f"{', '.join(given)}: the server decides these, not its client")
        token = None
        if args.token_env:
            token = os.environ.get(args.token_env)
            if not token:
                raise ValueError(f"--token-env {args.token_env}: that variable is not set")
        try:
            from ..remote import RemoteScheduler  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise ValueError(
                f"--server needs exec_sandbox.remote (pip install 'exec-sandbox[remote]'): {exc}"
            ) from None
        server: str = args.server
        return lambda: RemoteScheduler(server, token=token)  # type: ignore[no-any-return,unused-ignore]
    if args.token_env:
        raise ValueError("--token-env goes with --server")
    config = _config(args)

    def local() -> AbstractAsyncContextManager[SandboxScheduler]:
        from ..scheduler import Scheduler

        return Scheduler(config)

    return local


def _config(args: argparse.Namespace) -> SchedulerConfig:
    try:
        return scheduler_config(args)
    except VmConfigError as exc:
        raise ValueError(str(exc)) from None
