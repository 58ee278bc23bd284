"""`pip` in the VM: installs served by the host (docs/packages.md, "Installs from inside").

The image has no pip of its own. `pip`, `pip3` and `python3 -m pip` land here; `install` sends
the requirement texts to the host through the reserved host-socket tool `_sbx_install`. The host
resolves and builds wheels-only, exactly as for `packages=[...]`, with its own index
configuration (which never enters the VM), and writes the new packages as one archive into the
home directory; this module unpacks it into the user site directory (on the VM's work disk, so
it travels with pause/resume and fork, as `pip install --user` would) and removes it.

Output and exit status follow pip's: what it collected and installed, its ERROR lines, 1 on
failure. `list`, `freeze` and `show` answer from the installed metadata.
"""

from __future__ import annotations

import os
import sys

# The host's answer names the archive relative to the home directory, under this directory.
_ARCHIVE_DIR = ".cache/sbx-installs"
# pip options that take a value and only change what pip prints or where it caches.
_IGNORED_WITH_VALUE = {
    "--progress-bar",
    "--root-user-action",
    "--cache-dir",
    "--timeout",
    "--retries",
    "--log",
}
_IGNORED_FLAGS = {
    "-q",
    "--quiet",
    "-v",
    "--verbose",
    "--user",
    "--no-cache-dir",
    "--break-system-packages",
    "--disable-pip-version-check",
    "--pre",
    "--no-warn-script-location",
    "--no-input",
    "--isolated",
    "--prefer-binary",
    "--only-binary=:all:",
    "--no-color",
    "-qq",
    "-qqq",
    "-vv",
}
_UPGRADE = {"-U", "--upgrade", "--force-reinstall", "--upgrade-strategy=only-if-needed"}
_OTHER_SOURCES = (
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-e",
    "--editable",
    "-t",
    "--target",
    "--prefix",
    "--root",
    "--no-binary",
    "--no-index",
    "-c",
    "--constraint",
)
_ONLY_HOST = "ERROR: the sandbox installs from the host's package index only ({})"
_NOT_HERE = (
    "ERROR: installs reach the host only from code that session.exec() runs (not from a "
    "process of session.spawn() or a terminal such as `sbx shell`); from the host, use "
    "session.install()"
)


class _Usage(Exception):
    """A command line this pip does not take: its message is the ERROR line."""


def user_site() -> str:
    import site

    return site.getusersitepackages()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("EXEC_SANDBOX_PIP") == "real":
        return _real_pip(args)
    try:
        while args and args[0] in _IGNORED_FLAGS | {"--no-python-version-warning"}:
            args.pop(0)
        if not args or args[0] in ("-h", "--help", "help"):
            print(__doc__.strip())
            return 0
        command, rest = args[0], args[1:]
        if command in ("-V", "--version"):
            print(
                f"pip (exec-sandbox: installs served by the host) from {__file__} "
                f"(python {sys.version_info[0]}.{sys.version_info[1]})"
            )
            return 0
        if command == "install":
            return _install(rest)
        if command in ("list", "freeze"):
            return _list(command)
        if command == "show":
            return _show(rest)
        if command == "uninstall":
            raise _Usage("a running sandbox cannot uninstall packages")
        raise _Usage(f'unknown command "{command}"')
    except _Usage as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1


def magic(line: str) -> None:
    """`%pip ...` / `!pip ...` in a session cell (the REPL driver rewrites the line to this):
    pip's output, and a failure does not stop the cell, as in a notebook."""
    import shlex

    main(shlex.split(line))


def run() -> None:
    """`python3 -m pip` and the `pip` commands."""
    sys.exit(main())


def parse_install(args: list[str]) -> tuple[list[str], bool]:
    """The requirement texts of `pip install ARGS`, and whether an upgrade was asked for."""
    requirements: list[str] = []
    upgrade = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name = arg.split("=", 1)[0]
        if arg in _IGNORED_FLAGS or arg.startswith(("-q", "-v")) and set(arg[1:]) <= {"q", "v"}:
            continue
        if arg in _UPGRADE or arg.startswith("--upgrade-strategy"):
            upgrade = True
            continue
        if name in _IGNORED_WITH_VALUE:
            i += 0 if "=" in arg else 1
            continue
        if name in _OTHER_SOURCES:
            raise _Usage(_ONLY_HOST.format(name).removeprefix("ERROR: "))
        if name in ("-r", "--requirement") or arg.startswith("-r"):
            if arg.startswith("-r") and len(arg) > 2:
                path = arg[2:]
            elif "=" in arg:
                path = arg.split("=", 1)[1]
            else:
                path = args[i] if i < len(args) else ""
                i += 1
            requirements += _read_requirements(path)
            continue
        if arg.startswith("-"):
            raise _Usage(f"no such option: {arg}")
        if "://" in arg or "/" in arg or arg.endswith((".whl", ".tar.gz", ".zip")):
            raise _Usage(_ONLY_HOST.format(arg).removeprefix("ERROR: "))
        requirements.append(arg)
    if not requirements:
        raise _Usage('You must give at least one requirement to install (see "pip help install")')
    return requirements, upgrade


def _read_requirements(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise _Usage(f"Could not open requirements file: {exc}") from None
    texts = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            if line.startswith("-"):
                raise _Usage(_ONLY_HOST.format(line).removeprefix("ERROR: "))
            texts.append(line)
    return texts


def _install(args: list[str]) -> int:
    requirements, upgrade = parse_install(args)
    if any(_name(text) == "pip" for text in requirements):
        # `pip install -U pip` is common in scripts: not an error, and pip is not replaced.
        print(
            "Requirement already satisfied: pip (the sandbox's pip, served by the host; for the "
            "real pip set EXEC_SANDBOX_PIP=real, which needs network to the package index)"
        )
        requirements = [text for text in requirements if _name(text) != "pip"]
        if not requirements:
            return 0
    if os.environ.get("EXEC_SANDBOX_GUEST_INSTALLS") == "off":
        raise _Usage("installs are turned off in this sandbox")
    for text in requirements:
        print(f"Collecting {text}", flush=True)
    unpack_pending()
    reply = ask_host("python", requirements, upgrade=upgrade, not_here=_NOT_HERE, error="ERROR:")
    if reply is None:
        return 1
    site_dir = user_site()
    for name, version in reply.get("satisfied") or []:
        print(f"Requirement already satisfied: {name} in {site_dir} ({version})")
    installed = [(str(n), str(v)) for n, v in reply.get("installed") or []]
    archive = reply.get("archive")
    if installed and isinstance(archive, str):
        print("Installing collected packages: " + ", ".join(n for n, _ in installed), flush=True)
        try:
            _unpack(os.path.join(os.path.expanduser("~"), archive), site_dir)
        except (OSError, ValueError) as exc:
            print(f"ERROR: Could not install packages due to an OSError: {exc}", file=sys.stderr)
            return 1
        print("Successfully installed " + " ".join(f"{n}-{v}" for n, v in installed))
    refresh()
    return 0


def ask_host(
    kind: str, requirements: list[str], *, upgrade: bool, not_here: str, error: str
) -> dict | None:
    """The host's answer to an install (`_sbx_install`), or None once the failure is printed
    the way this kind's tool prints one (error: its prefix, e.g. "ERROR:" or "npm error")."""
    from . import ToolError, call

    try:
        reply = call("_sbx_install", kind=kind, requirements=requirements, upgrade=upgrade)
    except ToolError as exc:
        print(not_here if exc.refused else f"{error} {exc}", file=sys.stderr)
        return None
    if not isinstance(reply, dict):
        print(f"{error} the host's answer is not understood", file=sys.stderr)
        return None
    failure = reply.get("error")
    if failure is not None:
        lines = failure.get("lines") if isinstance(failure, dict) else None
        for line in lines if isinstance(lines, list) else [str(failure)]:
            print(str(line), file=sys.stderr)
        return None
    return reply


def unpack_pending() -> None:
    """Archives the host wrote whose unpacking never ran (the exec ended first, e.g. by its
    timeout): the host counts them as installed, so they are put in place now."""
    import glob

    home = os.path.expanduser("~")
    # Oldest first: a later javascript tree replaces an earlier one.
    pending = glob.glob(os.path.join(home, _ARCHIVE_DIR, "install-*.tar"))
    for archive in sorted(pending, key=os.path.getmtime):
        try:
            if os.path.basename(archive).startswith("install-python-"):
                _unpack(archive, user_site())
            else:
                from . import _npm

                _npm.replace_tree(archive)
        except (OSError, ValueError):
            pass


def _name(requirement: str) -> str:
    import re

    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    return re.sub(r"[-_.]+", "-", match[0]).lower() if match else ""


def _real_pip(args: list[str]) -> int:
    """EXEC_SANDBOX_PIP=real: the real pip, run from a private directory (never on the path of
    `python3 -m pip` otherwise). The first use gets pip itself from the host, like any package;
    then pip works as pip does, with the network the session has (none: it fails as pip
    fails), installing into the user site directory (PEP 668 marks Debian's python as
    externally managed)."""
    home = os.path.expanduser("~")
    private = os.path.join(home, ".local", "share", "exec-sandbox", "real-pip")
    if not os.path.isfile(os.path.join(private, "pip", "__init__.py")):
        from . import ToolError, call

        try:
            reply = call("_sbx_install", kind="python", requirements=["pip"], upgrade=False)
        except ToolError as exc:
            print(_NOT_HERE if exc.refused else f"ERROR: {exc}", file=sys.stderr)
            return 1
        error = reply.get("error") if isinstance(reply, dict) else "unusable answer"
        archive = reply.get("archive") if isinstance(reply, dict) else None
        if error is not None or not isinstance(archive, str):
            lines = error.get("lines") if isinstance(error, dict) else None
            for line in lines if isinstance(lines, list) else [f"ERROR: {error or 'no pip'}"]:
                print(str(line), file=sys.stderr)
            return 1
        _unpack(os.path.join(home, archive), private, os.path.join(private, "bin"))
    env = dict(os.environ, PYTHONPATH=private, PIP_BREAK_SYSTEM_PACKAGES="1")
    if "VIRTUAL_ENV" not in env:
        env.setdefault("PIP_USER", "1")
    env.pop("EXEC_SANDBOX_PIP", None)
    import subprocess

    return subprocess.call([sys.executable, "-m", "pip", *args], env=env)


def _unpack(archive: str, site_dir: str, bin_dir: str | None = None) -> None:
    """The host's archive: `site-packages/...` into the user site directory, `bin/...` into
    ~/.local/bin."""
    bin_dir = bin_dir or os.path.join(os.path.expanduser("~"), ".local", "bin")
    unpack_archive(archive, {"site-packages": site_dir, "bin": bin_dir})


def unpack_archive(archive: str, roots: dict[str, str]) -> None:
    """Unpack an install archive the host wrote, then remove it: each entry `TOP/rest` goes to
    roots[TOP]/rest, regular files and directories only (links and devices are never part of an
    installed package). The archive comes from the host; the checks keep a damaged one inside
    the roots (ValueError)."""
    import tarfile

    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                top, _, rest = member.name.partition("/")
                parts = rest.split("/")
                if top not in roots or not rest or ".." in parts or rest.startswith("/"):
                    raise ValueError(f"unexpected entry {member.name!r} in the install archive")
                if not (member.isfile() or member.isdir()):
                    continue
                dest = os.path.join(roots[top], rest)
                if member.isdir():
                    os.makedirs(dest, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    continue
                with source, open(dest, "wb") as out:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                os.chmod(dest, 0o755 if member.mode & 0o111 else 0o644)
    finally:
        try:
            os.unlink(archive)
        except OSError:
            pass


def refresh() -> None:
    """Make what was installed importable in this interpreter now."""
    import importlib

    site_dir = user_site()
    if os.path.isdir(site_dir) and site_dir not in sys.path:
        _add_site(site_dir)
    importlib.invalidate_caches()


def _add_site(site_dir: str) -> None:
    """Where `site` would have put it at start: before the system's site directories. (Like
    pip --target, .pth files of installed packages are not processed.)"""
    for i, entry in enumerate(sys.path):
        if entry.endswith(("site-packages", "dist-packages")):
            sys.path.insert(i, site_dir)
            break
    else:
        sys.path.append(site_dir)


def _list(command: str) -> int:
    from importlib import metadata

    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in {n.lower() for n in seen}:
            seen[name] = dist.version
    rows = sorted(seen.items(), key=lambda item: item[0].lower())
    if command == "freeze":
        for name, version in rows:
            print(f"{name}=={version}")
        return 0
    width = max([len("Package")] + [len(n) for n, _ in rows])
    print(f"{'Package':<{width}} Version")
    print(f"{'-' * width} -------")
    for name, version in rows:
        print(f"{name:<{width}} {version}")
    return 0


def _show(names: list[str]) -> int:
    from importlib import metadata

    status = 0
    for i, name in enumerate(n for n in names if not n.startswith("-")):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            print(f"WARNING: Package(s) not found: {name}", file=sys.stderr)
            status = 1
            continue
        if i:
            print("---")
        print(f"Name: {dist.metadata['Name']}\nVersion: {dist.version}")
        print(f"Location: {dist.locate_file('')}")
    return status
