"""`sbx token create|list|revoke`: the bearer tokens of `sbx serve` on TCP (docs/server.md,
"Security model"). They live hashed in the state directory; a running server sees a change on
its next request."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .. import paths
from ..errors import InputValidationError
from .arguments import EXIT_USAGE


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    token = commands.add_parser("token", help="the bearer tokens of sbx serve")
    actions = token.add_subparsers(dest="token_command", required=True)
    create = actions.add_parser(
        "create",
        help="make a token (printed once, stored hashed)",
        description="Make a token, printed once (only its hash is stored). A run token gets "
        "least privilege: its VMs have no network, no exposed ports, no secrets or "
        "http_headers and no volumes, unless granted below (an admin token has everything).",
    )
    create.add_argument("--name", required=True, help="its name (the owner of its sessions)")
    create.add_argument(
        "--scope",
        choices=("run", "admin"),
        default="run",
        help="run: code and its own sessions; admin: also templates, volumes, every session",
    )
    create.add_argument("--expires-in", type=float, metavar="DAYS", help="expiry (default: none)")
    create.add_argument("--max-sessions", type=int, metavar="N", help="open sessions at once")
    create.add_argument("--max-vms", type=int, metavar="N", help="VMs (runs + sessions) at once")
    grants = create.add_argument_group("grants of a run token (default: none of them)")
    grants.add_argument(
        "--allow-network",
        action="store_true",
        help="allow_network, to any names (allowed_domains optional)",
    )
    grants.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        metavar="D",
        help="allow_network limited to D and its subdomains (allowed_domains within them); "
        "repeatable",
    )
    grants.add_argument(
        "--allow-expose", action="store_true", help="expose_ports (host port fixed or not)"
    )
    grants.add_argument("--allow-secrets", action="store_true", help="secrets and http_headers")
    grants.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="NAME[:ro]",
        help="mount volume NAME (with :ro always read-only); repeatable",
    )
    create.add_argument(
        "--reuse-name",
        action="store_true",
        help="take a revoked token's name: the new token owns what the old one left",
    )
    listing = actions.add_parser("list", help="the tokens (names, scopes, expiry; no secrets)")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    revoke = actions.add_parser("revoke", help="forget a token: refused from its next request")
    revoke.add_argument("name", metavar="NAME")


def run(args: argparse.Namespace) -> int:
    # No server extra needed: the store and grants are plain Python.
    from ..server.grants import Grants
    from ..server.tokens import TokenStore

    store = TokenStore(paths.state_dir())
    try:
        if args.token_command == "create":
            granted = Grants.make(
                network=args.allow_network,
                domains=args.allow_domain,
                expose=args.allow_expose,
                secrets=args.allow_secrets,
                volumes=args.volume,
            )
            if args.scope == "admin" and granted != Grants():
                raise InputValidationError("an admin token has every grant: give none")
            token = store.create(
                args.name,
                scope=args.scope,
                expires_in_days=args.expires_in,
                max_sessions=args.max_sessions,
                max_vms=args.max_vms,
                grants=granted,
                reuse_name=args.reuse_name,
            )
            print(token)
            if sys.stdout.isatty():
                print("sbx: shown once; keep it secret", file=sys.stderr)
            return 0
        if args.token_command == "list":
            records = store.records()
            if args.json:
                print(json.dumps([r.public() for r in records], indent=2))
            elif not records:
                print("no tokens (sbx token create --name NAME makes one)")
            else:
                for r in records:
                    expires = "never" if r.expires_at is None else _when(r.expires_at)
                    state = " (expired)" if r.expired() else ""
                    print(
                        f"{r.name}  {r.scope}  created {_when(r.created_at)}  "
                        f"expires {expires}{state}  grants: {r.describe_grants()}"
                    )
            return 0
        if not store.revoke(args.name):
            print(f"sbx: no token {args.name!r}", file=sys.stderr)
            return 1
        return 0
    except InputValidationError as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return 1


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
