"""`sbx`: the command line. `sbx run` runs code in a fresh microVM; its exit status is the code's
(124 when the code timed out, 125 when the sandbox itself failed, 2 for bad arguments).

A cold `sbx run` also starts building the L1 memory snapshot of its configuration. A process that
exited right after the result would cancel that build and every run would cold boot again, so
after printing the result `sbx run` waits for it (at most SNAPSHOT_WAIT_SECONDS; only the first
run of a configuration builds one), unless `--no-snapshot-wait` is given."""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputValidationError
from ..models import ExecutionResult, Language, PortMapping
from ..network.request import parse_network_request
from ..scheduler import Scheduler
from ..volumes import parse_volume_option
from . import (
    mcp_cmd,
    serve_cmds,
    session_cmds,
    shell_cmds,
    template_cmds,
    token_cmds,
    volume_cmds,
)
from .arguments import (
    EXIT_USAGE,
    add_source_arguments,
    add_vm_options,
    exit_status,
    parse_env,
    resolve_source,
    run_command,
)
from .secret_option import parse_secret

if TYPE_CHECKING:  # the cluster needs the [ray] extra: imported only for --cluster
    from ..cluster import ClusterScheduler

# A template boot + warm-up + save takes 3-10 s under TCG; past this, give up (the next run cold
# boots and tries again).
SNAPSHOT_WAIT_SECONDS = 60.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sbx", description="Run untrusted code in a microVM.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run code in a fresh VM")
    add_source_arguments(run)
    add_vm_options(
        run,
        timeout_help="timeout in seconds (1..86400; 0: no limit)",
        env_help="environment variable for the code",
    )
    run.add_argument(
        "--upload",
        action="append",
        default=[],
        metavar="LOCAL:GUEST",
        help="copy a host file into the guest home before the code runs",
    )
    run.add_argument(
        "--download",
        action="append",
        default=[],
        metavar="GUEST[:LOCAL]",
        help="copy a guest file to the host after the code ran "
        "(default: its name, in the current directory)",
    )
    run.add_argument(
        "--network",
        action="store_true",
        help="let the code connect out by name (any public name, or --allow-domain)",
    )
    run.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        dest="allowed_domains",
        metavar="D",
        help="allow this name and its subdomains (name:port opens "
        "another port besides 80 and 443); implies --network",
    )
    run.add_argument(
        "--secret",
        action="append",
        default=[],
        dest="secrets",
        metavar="NAME=ENVVAR@HOST",
        help="the guest's NAME holds a placeholder; requests to HOST (comma-separated hosts) "
        "get the value of this host's ENVVAR in its place (never on the command line); "
        "implies --network",
    )
    run.add_argument(
        "--volume",
        action="append",
        default=[],
        dest="volumes",
        metavar="PATH=NAME[:ro]",
        help="mount the volume NAME (sbx volume create) at guest PATH, read-only with :ro "
        "(repeatable)",
    )
    run.add_argument(
        "--expose",
        action="append",
        default=[],
        metavar="PORT[:HOST]",
        help="reach guest PORT at 127.0.0.1:HOST (a free port without HOST)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON (with the connection log; binary outputs in base64)",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    run.add_argument("--debug", action="store_true", help="debug logging and the boot log")
    run.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run on a Ray cluster of sandbox hosts (ADDRESS as for ray.init, e.g. "
        "HEAD:6379 or auto; needs exec-sandbox[ray])",
    )
    run.add_argument(
        "--no-snapshot-wait",
        action="store_true",
        help="exit right after the result, without waiting for the memory "
        "snapshot that makes the next run of this configuration faster",
    )
    setup = commands.add_parser("setup", help="build (or verify) the guest kernel and root image")
    setup.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    setup.add_argument(
        "--install-deps",
        action="store_true",
        help="install the missing build tools with apt-get (sudo when not root)",
    )
    doctor = commands.add_parser("doctor", help="what this host provides, and what is missing")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="check every host of a Ray cluster instead of this machine: each "
        "host's layers and capacity",
    )
    session_cmds.add_parser(commands)
    shell_cmds.add_parser(commands)
    template_cmds.add_parser(commands)
    volume_cmds.add_parser(commands)
    serve_cmds.add_parser(commands)
    token_cmds.add_parser(commands)
    mcp_cmd.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "debug", False) else logging.WARNING,
        format="sbx: %(levelname)s %(message)s",
    )
    if args.command == "doctor":
        if args.cluster:
            from . import cluster_cmds

            return cluster_cmds.doctor(args.cluster, args.json)
        return _doctor(args.json)
    if args.command == "session":
        return session_cmds.run(args)
    if args.command == "shell":
        return shell_cmds.run(args)
    if args.command == "template":
        return template_cmds.run(args)
    if args.command == "volume":
        return volume_cmds.run(args)
    if args.command == "serve":
        return serve_cmds.run(args)
    if args.command == "token":
        return token_cmds.run(args)
    if args.command == "mcp":
        return mcp_cmd.run(args)
    if args.command == "setup":
        from ..images import builder
        from ..vm.jail import ensure_qemu_user

        # The system user QEMU runs as when the caller is root (docs/security.md).
        try:
            done = ensure_qemu_user()
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"sbx: cannot create the QEMU user: {exc}", file=sys.stderr)
            return 1
        if not args.quiet:
            print(f"sbx: {done}", file=sys.stderr)
        return builder.main(quiet=args.quiet, install_deps=args.install_deps)
    try:
        code, language = resolve_source(args)
        env = parse_env(args.env)
        uploads = [_parse_upload(spec) for spec in args.upload]
        downloads = [_parse_download(spec) for spec in args.download]
        args.expose = [_parse_expose(spec) for spec in args.expose]
        args.secrets = [parse_secret(spec, os.environ) for spec in args.secrets]
        args.network = args.network or bool(args.secrets)
        # Checked here too, so that bad network arguments are usage errors before anything
        # else (the images, the accelerator) is looked at.
        parse_network_request(
            args.network or bool(args.allowed_domains),
            args.allowed_domains or None,
            args.expose or None,
            args.secrets or None,
        )
    except (ValueError, InputValidationError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        try:
            return exit_status(await _run(args, code, language, env, uploads, downloads))
        except _Interrupted as exc:
            return exc.status

    return run_command(run)


def _report(args: argparse.Namespace, result: ExecutionResult) -> None:
    """What follows the code's streamed output: the JSON result, or why it was stopped."""
    if args.json:
        report = dataclasses.asdict(result)
        report["outputs"] = [_output_json(o.mime_type, o.data) for o in result.outputs]
        print(json.dumps(report, indent=2))
    else:
        # A terminal shows no figure: say what the code showed, and where to get it.
        for output in result.outputs:
            size = len(output.data.encode() if isinstance(output.data, str) else output.data)
            sys.stderr.write(f"[output: {output.mime_type}, {size} bytes; --json to get it]\n")
        if result.exit_code == -1:
            sys.stderr.write(result.stderr.rsplit("\n", 2)[-2] + "\n")
    sys.stdout.flush()
    sys.stderr.flush()


def _output_json(mime_type: str, data: bytes | str) -> dict[str, str]:
    """A rich output in --json: text as it is, binary data (a figure's PNG) base64, marked so
    (JSON has no bytes)."""
    if isinstance(data, str):
        return {"mime_type": mime_type, "data": data}
    return {"mime_type": mime_type, "data": base64.b64encode(data).decode(), "encoding": "base64"}


class _Interrupted(Exception):
    """Ctrl-C while waiting for the snapshot, after the result was reported: exit with the
    code's status, not 130 (the snapshot build is cancelled and simply made by a later run)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _doctor(as_json: bool) -> int:
    """Exit 0 when everything needed to run code is there, 1 otherwise."""
    from . import doctor

    checks = doctor.run_checks()
    if as_json:
        print(json.dumps(doctor.as_dicts(checks), indent=2))
    else:
        print(doctor.render(checks))
    return 0 if doctor.healthy(checks) else 1


def _parse_upload(spec: str) -> tuple[Path, str]:
    local, sep, guest = spec.partition(":")
    if not sep or not local or not guest:
        raise ValueError(f"--upload expects LOCAL:GUEST, got {spec!r}")
    if not Path(local).is_file():
        raise ValueError(f"--upload: {local} is not a file")
    return Path(local), guest


def _parse_download(spec: str) -> tuple[str, Path]:
    guest, _, local = spec.partition(":")
    if not guest:
        raise ValueError(f"--download expects GUEST[:LOCAL], got {spec!r}")
    return guest, Path(local) if local else Path(Path(guest).name)


def _parse_expose(spec: str) -> PortMapping:
    """PORT or PORT:HOST (both numbers; ranges are checked by the scheduler)."""
    internal, _, external = spec.partition(":")
    if not internal.isdigit() or (external and not external.isdigit()):
        raise ValueError(f"--expose {spec!r}: expected PORT or PORT:HOST_PORT")
    return PortMapping(int(internal), int(external) if external else None)


async def _run(
    args: argparse.Namespace,
    code: str,
    language: Language,
    env: dict[str, str],
    uploads: list[tuple[Path, str]],
    downloads: list[tuple[str, Path]],
) -> ExecutionResult:
    progress = _Progress(enabled=not args.quiet and not args.json and sys.stderr.isatty())

    def out(text: str) -> None:
        progress.clear()
        sys.stdout.write(text)
        sys.stdout.flush()

    def err(text: str) -> None:
        progress.clear()
        sys.stderr.write(text)
        sys.stderr.flush()

    if args.cluster:
        from ..cluster import ClusterScheduler

        # The hosts keep their snapshots: nothing of this process to wait for after the result.
        async with ClusterScheduler(address=args.cluster) as cluster:
            result = await _execute(
                cluster, progress, args, code, language, env, uploads, downloads, out, err
            )
            _report(args, result)
            return result
    async with Scheduler() as scheduler:
        result = await _execute(
            scheduler, progress, args, code, language, env, uploads, downloads, out, err
        )
        _report(args, result)
        # Nothing to wait for when snapshots are off, or this configuration already had one.
        if not args.no_snapshot_wait and not await scheduler.wait_snapshots(0):
            progress.show("sbx: saving a memory snapshot for faster next runs...")
            try:
                await scheduler.wait_snapshots(SNAPSHOT_WAIT_SECONDS)
            except asyncio.CancelledError:
                raise _Interrupted(exit_status(result)) from None
            finally:
                progress.clear()
        return result


async def _execute(
    scheduler: Scheduler | ClusterScheduler,
    progress: _Progress,
    args: argparse.Namespace,
    code: str,
    language: Language,
    env: dict[str, str],
    uploads: list[tuple[Path, str]],
    downloads: list[tuple[str, Path]],
    out: Callable[[str], None],
    err: Callable[[str], None],
) -> ExecutionResult:
    """The code's result, its output streamed through out/err unless --json."""
    stream = not args.json
    progress.show(f"sbx: starting a {language} VM ({scheduler.accelerator})...")
    started = time.monotonic()

    def boot_log(text: str) -> None:
        # Package layer builds report their steps here: a status line with the time so far.
        if text.startswith("[packages] "):
            progress.show(
                f"sbx: packages: {text[11:].strip()}... ({time.monotonic() - started:.0f} s)"
            )
        if args.debug:
            err(text)

    # run() and session() take the same options.
    options: dict[str, Any] = {
        "language": language,
        "packages": args.packages or None,
        "timeout_seconds": args.timeout,
        "memory_mb": args.memory,
        "vcpus": args.vcpus,
        "disk_mb": args.disk_mb,
        "template": args.template,
        "env_vars": env or None,
        "allow_network": args.network or bool(args.allowed_domains),
        "allowed_domains": args.allowed_domains or None,
        "expose_ports": args.expose or None,
        "secrets": args.secrets or None,
        "volumes": dict(parse_volume_option(v) for v in args.volumes) or None,
        "on_stdout": out if stream else None,
        "on_stderr": err if stream else None,
        "on_boot_log": boot_log,
    }
    try:
        if not uploads and not downloads and not args.expose:
            return await scheduler.run(code, **options)
        # Files need a VM that outlives the code, and exposed ports are shown before the code
        # runs: a session of one exec().
        session = await scheduler.session(**options)
        async with session:
            # A cluster session's ports are on its worker's loopback: none to show here.
            for exposed in getattr(session, "exposed_ports", []):
                progress.clear()
                sys.stderr.write(f"sbx: guest port {exposed.internal} at {exposed.url}\n")
            for local, guest in uploads:
                await session.write_file(guest, local)
            result = await session.exec(code)
            for guest_path, local_path in downloads:
                await session.read_file(guest_path, destination=local_path)
            return result
    finally:
        progress.clear()


class _Progress:
    """A one-line status on a terminal's stderr, erased before any output of the code."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._shown = False

    def show(self, text: str) -> None:
        if self._enabled:
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False


if __name__ == "__main__":
    sys.exit(main())
