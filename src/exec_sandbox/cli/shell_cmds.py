"""`sbx shell`: an interactive shell in a sandbox, as `docker exec -it` gives one in a container.

The host terminal goes into raw mode and every keystroke goes to a terminal in the VM
(Session.terminal(): a pty, the image's bash as a login shell); its output is written back as it
comes, a resized window (SIGWINCH) resizes it, and `sbx shell` exits with the shell's status.
`--resume ID` opens the shell in a paused session (`sbx session new`, Session.pause()), and
`--pause` pauses the session again when the shell exits (the new id goes to stderr)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

from ..errors import InputValidationError
from ..models import LANGUAGE_NAMES
from ..processes import Terminal
from ..scheduler import Scheduler
from ..session import Session
from ..snapshots.sessions import check_id
from ..volumes import VolumeMount, parse_volume_option
from .arguments import EXIT_USAGE, parse_env, run_command
from .secret_option import parse_secret

_READ_SIZE = 4096
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_KEYS_QUEUED_MAX = 64  # reads of stdin not yet written to the guest (256 KiB)


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    shell = commands.add_parser(
        "shell", help="an interactive shell in a new sandbox or a paused session"
    )
    shell.add_argument(
        "--resume", metavar="ID", help="open the shell in this paused session (sbx session list)"
    )
    shell.add_argument(
        "--pause",
        action="store_true",
        help="pause the session when the shell exits (prints the new id) instead of closing it",
    )
    shell.add_argument(
        "-l",
        "--language",
        choices=LANGUAGE_NAMES,
        default="raw",
        help="the session's REPL language, for later `sbx session resume` (default raw)",
    )
    shell.add_argument("-m", "--memory", type=int, help="guest memory in MB (>= 128)")
    shell.add_argument("--vcpus", type=int, help="virtual CPUs of the VM (1..8, default 1)")
    shell.add_argument("--template", metavar="NAME", help="a shell in this template's image")
    shell.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VALUE", help="for the shell"
    )
    shell.add_argument("--network", action="store_true", help="let the sandbox connect out by name")
    shell.add_argument(
        "--secret",
        action="append",
        default=[],
        dest="secrets",
        metavar="NAME=ENVVAR@HOST",
        help="as for sbx run (the value from this host's ENVVAR); implies --network; not with "
        "--resume (a paused session keeps no secrets)",
    )
    shell.add_argument(
        "--disk-mb",
        type=int,
        metavar="MB",
        help="size of the VM's disk for /home/user and /tmp (64..1048576, default 4096)",
    )
    shell.add_argument(
        "--volume",
        action="append",
        default=[],
        dest="volumes",
        metavar="PATH=NAME[:ro]",
        help="mount the volume NAME (sbx volume create) at guest PATH, read-only with :ro "
        "(repeatable; with --pause read-only only)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        env = parse_env(args.env)
        if args.resume is not None:
            if args.secrets:
                raise ValueError("--secret cannot be given with --resume (secrets are not saved)")
            check_id(args.resume)
        args.secrets = [parse_secret(spec, os.environ) for spec in args.secrets]
        volumes = _volumes(args)
    except (ValueError, InputValidationError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def go() -> int:
        async with Scheduler() as scheduler:
            if args.resume is not None:
                session = await scheduler.resume(args.resume)
            else:
                options: dict[str, Any] = {}
                if args.network or args.secrets:
                    options["allow_network"] = True
                if args.secrets:
                    options["secrets"] = args.secrets
                session = await scheduler.session(
                    language=args.language,
                    memory_mb=args.memory,
                    vcpus=args.vcpus,
                    template=args.template,
                    env_vars=env or None,
                    disk_mb=args.disk_mb,
                    volumes=volumes or None,
                    **options,
                )
            async with contextlib.AsyncExitStack() as stack:
                if not args.pause:
                    stack.push_async_callback(session.close)
                status = await _attach(session)
                if args.pause:
                    snapshot = await session.pause()
                    print(f"sbx: paused as {snapshot.id}", file=sys.stderr)
            return status

    return run_command(go)


def _volumes(args: argparse.Namespace) -> dict[str, VolumeMount]:
    """--volume for a new sandbox. With --pause, what a paused session cannot keep is refused
    before the VM starts, not after the shell: a read-write volume (docs/design.md, "Volumes";
    the network is set up again on resume)."""
    volumes = dict(parse_volume_option(option) for option in args.volumes)
    writable = [path for path, mount in volumes.items() if not mount.read_only]
    if args.pause and writable:
        raise ValueError(f"--pause keeps volumes read-only only: add :ro ({', '.join(writable)})")
    return volumes


def _size() -> tuple[int, int]:
    """The host terminal's size (80x24 when stdout is not a terminal)."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return 80, 24
    return max(1, min(size.columns, 1000)), max(1, min(size.lines, 1000))


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The host terminal in raw mode (keystrokes as they are typed, Ctrl-C as a byte for the
    guest's shell, no local echo) while the shell runs; restored whatever happens."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _attach(session: Session) -> int:
    """Connect this process's stdin/stdout to a terminal in the session until its shell exits;
    returns the shell's exit status."""
    loop = asyncio.get_running_loop()
    cols, rows = _size()
    terminal = await session.terminal(cols, rows)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    keys: asyncio.Queue[bytes] = asyncio.Queue()
    # Reading stdin pauses while _KEYS_QUEUED_MAX reads wait for the guest: a terminal that takes
    # no input (a program that never reads, a guest that never answers) would otherwise have an
    # endless stdin (`yes | sbx shell`, a huge paste) read into this process's memory.
    paused = [False]

    def on_keys() -> None:
        try:
            data = os.read(stdin, _READ_SIZE)
        except BlockingIOError:
            return
        if not data:  # stdin closed (not a terminal): the shell gets end of file
            loop.remove_reader(stdin)
        elif keys.qsize() + 1 >= _KEYS_QUEUED_MAX:
            loop.remove_reader(stdin)
            paused[0] = True
        keys.put_nowait(data)

    def on_resize() -> None:
        new_cols, new_rows = _size()
        loop.create_task(terminal.resize(new_cols, new_rows))

    async def forward_keys() -> None:
        while True:
            data = await keys.get()
            if paused[0] and keys.qsize() < _KEYS_QUEUED_MAX // 2:
                paused[0] = False
                loop.add_reader(stdin, on_keys)
            if not data:
                await terminal.close_stdin()
                return
            await terminal.write(data)

    writer = loop.create_task(forward_keys())
    copier = loop.create_task(_copy_output(terminal, stdout))
    # SIGTERM (kill) and SIGHUP (the window closed) would end Python at once, leaving the user's
    # terminal raw and the session to nobody: they end the attachment instead, and the caller
    # closes (or pauses) the session as on any other exit.
    stopped: list[int] = []

    def on_stop(signum: int) -> None:
        stopped.append(signum)
        copier.cancel()

    with _raw(stdin):
        loop.add_reader(stdin, on_keys)
        loop.add_signal_handler(signal.SIGWINCH, on_resize)
        for signum in _STOP_SIGNALS:
            loop.add_signal_handler(signum, on_stop, signum)
        try:
            await copier
        except asyncio.CancelledError:
            if not stopped:
                raise
        finally:
            loop.remove_reader(stdin)
            loop.remove_signal_handler(signal.SIGWINCH)
            for signum in _STOP_SIGNALS:
                loop.remove_signal_handler(signum)
            copier.cancel()
            writer.cancel()
    with contextlib.suppress(asyncio.CancelledError, BrokenPipeError):
        await writer
    if stopped:
        return 128 + stopped[0]
    return await terminal.wait(timeout=30)


async def _copy_output(terminal: Terminal, stdout: int) -> None:
    async for chunk in terminal:
        # A few KB at a time to a terminal: a short write, done here in order.
        view = memoryview(chunk)
        while view:
            written = os.write(stdout, view)
            view = view[written:]
