"""`sbx serve`: the Scheduler of this machine served over a Unix socket and/or 127.0.0.1
(docs/server.md). Needs the `exec-sandbox[server]` extra."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths
from ..errors import VmConfigError
from .arguments import EXIT_USAGE, add_scheduler_options, run_command, scheduler_config

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from ..scheduler import Scheduler
    from ..server.serve import MountFactory


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = commands.add_parser(
        "serve", help="serve sandboxes over HTTP and WebSocket (Unix socket, tokens on TCP)"
    )
    serve.add_argument(
        "--socket",
        type=Path,
        metavar="PATH",
        help=f"the Unix socket (mode 0600; default {paths.server_socket()})",
    )
    serve.add_argument(
        "--no-socket", action="store_true", help="no Unix socket (TCP only: needs --port)"
    )
    serve.add_argument("--port", type=int, metavar="N", help="also listen on 127.0.0.1:N (0: any)")
    serve.add_argument(
        "--host",
        metavar="ADDR",
        help="listen on ADDR instead of 127.0.0.1 (with --port; anything not loopback "
        "should have --tls-cert/--tls-key)",
    )
    serve.add_argument("--tls-cert", type=Path, metavar="FILE", help="TLS certificate (PEM)")
    serve.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM)")
    serve.add_argument(
        "--on-shutdown",
        choices=("pause", "close"),
        default="pause",
        help="what SIGTERM does to open sessions: pause them (the next server gives them "
        "back under the same ids) or close them (default: pause)",
    )
    serve.add_argument(
        "--max-sessions-per-token", type=int, metavar="N", help="open sessions per token"
    )
    serve.add_argument(
        "--max-vms-per-token", type=int, metavar="N", help="VMs (runs + sessions) per token"
    )
    serve.add_argument(
        "--no-mcp", action="store_true", help="no MCP endpoint at /mcp (streamable HTTP)"
    )
    serve.add_argument(
        "--mcp-max-sessions",
        type=int,
        metavar="N",
        help="sessions each caller may hold open through /mcp (default 8)",
    )
    add_scheduler_options(serve)
    serve.add_argument(
        "--print-openapi",
        action="store_true",
        help="print the OpenAPI document and exit (docs/openapi.json is this)",
    )
    serve.add_argument("--debug", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    try:
        from ..server import serve as _serve
    except ImportError as exc:
        print(
            f"sbx serve needs the server extra (pip install 'exec-sandbox[server]'): {exc}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.print_openapi:
        from ..server.app import openapi_document

        print(json.dumps(openapi_document(), indent=2, sort_keys=True))
        return 0
    if args.host is not None and args.port is None:
        print("sbx: --host needs --port", file=sys.stderr)
        return EXIT_USAGE
    options = _serve.ServeOptions(
        socket_path=None if args.no_socket else (args.socket or paths.server_socket()),
        port=args.port,
        host=args.host or "127.0.0.1",
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        on_shutdown=args.on_shutdown,
        max_sessions_per_token=args.max_sessions_per_token,
        max_vms_per_token=args.max_vms_per_token,
    )
    try:
        _serve.check_address(options, lambda _: None)
        config = scheduler_config(args)
    except (_serve.ServeError, VmConfigError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def announce(line: str) -> None:
        print(line, flush=True)

    if args.mcp_max_sessions is not None and args.mcp_max_sessions < 1:
        print("sbx: --mcp-max-sessions must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    mounts = {} if args.no_mcp else {"/mcp": _mcp_mount(args)}

    async def go() -> int:
        try:
            await _serve.serve(options, config, paths.state_dir(), announce, mounts)
        except (_serve.ServeError, OSError) as exc:
            print(f"sbx: {exc}", file=sys.stderr)
            return 1
        return 0

    return run_command(go)


def _mcp_mount(args: argparse.Namespace) -> MountFactory:
    """The MCP endpoint on the server's Scheduler (docs/mcp.md, "Over sbx serve"): the SDK's
    Host/Origin checks admit loopback names, and the --host name when one was given."""
    from ..mcp_server import DEFAULT_MAX_SESSIONS, LOOPBACK_ONLY, http_app
    from ..server.grants import SERVED_MCP_OPTIONS

    security = LOOPBACK_ONLY
    if args.host is not None:
        names = [args.host, f"{args.host}:*"]
        security = LOOPBACK_ONLY.model_copy(
            update={
                "allowed_hosts": [*LOOPBACK_ONLY.allowed_hosts, *names],
                "allowed_origins": [
                    *LOOPBACK_ONLY.allowed_origins,
                    *(f"{scheme}://{n}" for scheme in ("http", "https") for n in names),
                ],
            }
        )
    max_sessions = args.mcp_max_sessions or DEFAULT_MAX_SESSIONS

    def mount(scheduler: Scheduler) -> contextlib.AbstractAsyncContextManager[ASGIApp]:
        # The server owns the Scheduler: the MCP app uses it and leaves it open.
        return http_app(
            lambda: contextlib.nullcontext(scheduler),
            max_sessions=max_sessions,
            # Within every token's grants: /mcp cannot ask a token's grants for more.
            options=SERVED_MCP_OPTIONS,
            transport_security=security,
        )

    return mount


__all__ = ["add_parser", "run"]
