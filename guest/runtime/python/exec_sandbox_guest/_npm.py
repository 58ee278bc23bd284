"""`npm` in the VM: installs served by the host (docs/packages.md, "Installs from inside").

`npm install|i|add NAME[@VERSION]...` sends the specifiers to the host
through the reserved host-socket tool `_sbx_install` (as the sandbox's pip does, `_install`).
npm re-hoists a whole tree on every install, so the host builds the complete tree (the earlier
installs' packages pinned, the new ones on top, `--ignore-scripts`) and writes it as one archive
into the home directory; this module puts it in place of ~/node_modules, where require() and
import() of code under the home directory look first (a session's `packages=` layer stays
beneath, at /node_modules). Output and exit status follow npm's.

With EXEC_SANDBOX_NPM=real, the real npm runs instead (the one that came with the image's node,
from the same pinned wheel): it needs network to a registry, which the session's network policy
and the code's own configuration decide; the host neither serves nor records what it installs.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

_INSTALL = {"install", "i", "add", "isntall", "in"}
_IGNORED_FLAGS = {
    "--save",
    "-S",
    "--save-prod",
    "-P",
    "--save-dev",
    "-D",
    "--save-exact",
    "-E",
    "--no-save",
    "--silent",
    "-s",
    "--quiet",
    "-q",
    "--no-audit",
    "--no-fund",
    "--ignore-scripts",
    "--no-package-lock",
    "--prefer-offline",
    "--loglevel=error",
    "-g",
    "--global",
    "--legacy-peer-deps",
    "--no-progress",
}
_NOT_HERE = (
    "npm error installs reach the host only from code that session.exec() runs (not from a "
    "process of session.spawn() or a terminal such as `sbx shell`); from the host, use "
    "session.install()"
)


# The real npm, kept off PATH: the image's node starts it.
_NODE = "/usr/bin/node"
_REAL_NPM = "/usr/lib/sbx/npm/bin/npm-cli.js"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("EXEC_SANDBOX_NPM") == "real":
        return _real_npm(args)
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if args[0] in ("-v", "--version", "version"):
        print("exec-sandbox npm (installs served by the host)")
        return 0
    if args[0] in _INSTALL:
        return _install(args[1:])
    if args[0] in ("ls", "list", "ll", "la"):
        return _list()
    print(
        f"npm error the sandbox's npm only installs packages and lists them ({args[0]!r})",
        file=sys.stderr,
    )
    return 1


def run() -> None:
    sys.exit(main())


def _project_root(start: str) -> str | None:
    """The nearest directory from start up, "/" excluded, with a package.json or node_modules."""
    here = os.path.abspath(start)
    while here != "/":
        if os.path.exists(os.path.join(here, "package.json")) or os.path.isdir(
            os.path.join(here, "node_modules")
        ):
            return here
        here = os.path.dirname(here)
    return None


def _real_npm(args: list[str]) -> int:
    """EXEC_SANDBOX_NPM=real: this process becomes the real npm (the variable is dropped, so
    what npm runs does not come back here)."""
    if not os.path.exists(_REAL_NPM):
        print("npm error this image has no npm of its own (EXEC_SANDBOX_NPM=real)", file=sys.stderr)
        return 1
    env = {k: v for k, v in os.environ.items() if k != "EXEC_SANDBOX_NPM"}
    # npm takes the nearest directory up from here with a package.json or node_modules as the
    # project; the image's /node_modules (a read-only layer mount point) would make that "/".
    # Outside any project, the current directory is the project, as in an empty one elsewhere.
    if "--prefix" not in args and not any(a.startswith("--prefix=") for a in args):
        if _project_root(os.getcwd()) is None:
            args = [*args, "--prefix", os.getcwd()]
    os.execve(_NODE, [_NODE, _REAL_NPM, *args], env)
    return 1  # not reached


def parse_install(args: list[str]) -> list[str]:
    specs = []
    for arg in args:
        if arg in _IGNORED_FLAGS or arg.startswith("--loglevel"):
            continue
        if arg.startswith("-"):
            raise ValueError(
                f"npm error unknown option {arg!r} (the sandbox installs from the "
                "host's registry only)"
            )
        # Paths, URLs, git and tarball specs: only a scope has a "/".
        slashes = arg.count("/")
        if ":" in arg or arg.startswith((".", "/", "~")) or slashes > arg.startswith("@"):
            raise ValueError(
                f"npm error the sandbox installs from the host's registry only ({arg})"
            )
        specs.append(arg)
    if not specs:
        raise ValueError(
            "npm error the sandbox's npm installs named packages only "
            "(no package.json install): npm install NAME[@VERSION]"
        )
    return specs


def _install(args: list[str]) -> int:
    started = time.monotonic()
    try:
        specs = parse_install(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    from . import _install

    _install.unpack_pending()
    reply = _install.ask_host(
        "javascript", specs, upgrade=False, not_here=_NOT_HERE, error="npm error"
    )
    if reply is None:
        return 1
    added = reply.get("installed") or []
    archive = reply.get("archive")
    if isinstance(archive, str):
        try:
            replace_tree(os.path.join(os.path.expanduser("~"), archive))
        except (OSError, ValueError) as exc:
            print(f"npm error {exc}", file=sys.stderr)
            return 1
    seconds = time.monotonic() - started
    count = len(added)
    if count:
        print(f"\nadded {count} package{'s' if count != 1 else ''} in {seconds:.1f}s")
    else:
        print(f"\nup to date in {seconds:.1f}s")
    return 0


def replace_tree(archive: str) -> None:
    """Unpack the host's archive (node_modules/...) beside ~/node_modules, then swap it in."""
    from . import _install

    home = os.path.expanduser("~")
    staging = os.path.join(home, ".cache", "sbx-installs", "tree")
    shutil.rmtree(staging, ignore_errors=True)
    _install.unpack_archive(archive, {"node_modules": os.path.join(staging, "node_modules")})
    new = os.path.join(staging, "node_modules")
    os.makedirs(new, exist_ok=True)
    target = os.path.join(home, "node_modules")
    old = os.path.join(home, ".cache", "sbx-installs", "previous-tree")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(target):
        os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)


def _list() -> int:
    import json

    root = os.path.join(os.path.expanduser("~"), "node_modules")
    print(root)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    for name in names:
        dirs = [name]
        if name.startswith("@"):
            dirs = [f"{name}/{sub}" for sub in sorted(os.listdir(os.path.join(root, name)))]
        for d in dirs:
            try:
                with open(os.path.join(root, d, "package.json"), encoding="utf-8") as f:
                    print(f"+-- {d}@{json.load(f).get('version', '?')}")
            except (OSError, ValueError):
                continue
    return 0


if __name__ == "__main__":
    run()
