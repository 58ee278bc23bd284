"""Python package trees, built on the host with the host's pip for the guest's interpreter.

No package code ever runs on the host: only wheels are taken (`--only-binary=:all:`, so no sdist
is built and no setup.py runs), and installing a wheel is unpacking a zip. The host's pip
configuration (index URL, extra indexes, credentials, proxy, CA bundle) applies as it is, so
private indexes work and their credentials never reach a VM.

Steps: resolve (pip's resolver, a report and no install), download (the locked wheels, hashes
checked), unpack (`pip install --no-index --target`), bytecode (hash-based .pyc, compiled by an
interpreter of the guest's version).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PackageBuildError, VmPermanentError
from .specs import PackageSpec
from .target import GuestTarget
from .tools import ToolRefused, ToolResult, redact_urls, run_tool

log = logging.getLogger("exec_sandbox")

RESOLVE_TIMEOUT_SECONDS = 300.0
DOWNLOAD_TIMEOUT_SECONDS = 900.0
UNPACK_TIMEOUT_SECONDS = 300.0
COMPILE_TIMEOUT_SECONDS = 600.0
# `pip install --report` and `--dry-run` came with pip 22.2.
_PIP_MIN_VERSION = (22, 2)
# Signs in pip's output that the index could not be reached (then a missing package is not the
# request's fault, and a retry may succeed).
_NETWORK_TROUBLE = re.compile(
    r"NewConnectionError|Max retries exceeded|ConnectTimeout|ReadTimeout|ProxyError|SSLError|"
    r"Temporary failure in name resolution|Connection refused|Network is unreachable"
)
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_SHEBANG_PYTHON = b"#!/usr/bin/python3\n"
_LOCKED_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]*")


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    url: str
    sha256: str


def pip_argv(*args: str) -> list[str]:
    """The host's pip, run by this interpreter (its configuration is the user's)."""
    return [sys.executable, "-m", "pip", *args]


async def check_pip() -> None:
    result = await run_tool(pip_argv("--version"), timeout=60, what="pip --version")
    match = re.match(r"pip (\d+)\.(\d+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise VmPermanentError(
            f"pip is needed to build python package layers and is not usable with "
            f"{sys.executable}: {result.tail()} (install it: {sys.executable} -m ensurepip)"
        )
    if (int(match[1]), int(match[2])) < _PIP_MIN_VERSION:
        raise VmPermanentError(
            f"pip {match[1]}.{match[2]} is too old to build package layers (22.2 or newer: "
            f"{sys.executable} -m pip install -U pip)"
        )


async def resolve(
    specs: tuple[PackageSpec, ...],
    target: GuestTarget,
    work: Path,
    constraints: tuple[str, ...] = (),
) -> list[LockedWheel]:
    """The exact wheels (with their hashes) that the requirements resolve to for the guest.
    constraints: `name==version` lines the resolution must keep (what a VM has installed)."""
    await check_pip()
    requirements = work / "requirements.in"
    requirements.write_text("".join(spec.requirement + "\n" for spec in specs))
    options: list[str] = []
    if constraints:
        (work / "constraints.txt").write_text("".join(line + "\n" for line in constraints))
        options = ["-c", str(work / "constraints.txt")]
    report = work / "resolve-report.json"
    result = await run_tool(
        pip_argv(
            "install",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
            "--target",
            str(work / "dry-run-target"),
            "--progress-bar",
            "off",
            *target.pip_target_options(),
            *options,
            "-r",
            str(requirements),
        ),
        timeout=RESOLVE_TIMEOUT_SECONDS,
        what="resolving the packages with pip",
    )
    if result.returncode != 0:
        raise _pip_failure(result, target)
    try:
        data = json.loads(report.read_text())
        return sorted((_locked(item) for item in data["install"]), key=lambda w: w.name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackageBuildError(f"pip's resolution report is unusable: {exc}") from None


def _locked(item: dict[str, Any]) -> LockedWheel:
    info = item["download_info"]
    sha256 = info["archive_info"]["hashes"]["sha256"]
    meta = item["metadata"]
    url = str(info["url"])
    # Name, version and URL go into requirement lines of their own: nothing that could start
    # another option or requirement.
    if (
        not url.endswith(".whl")
        or not re.fullmatch(r"[0-9a-f]{64}", sha256)
        or re.search(r"\s", url)
        or not _LOCKED_TEXT.fullmatch(str(meta["name"]))
        or not _LOCKED_TEXT.fullmatch(str(meta["version"]))
    ):
        raise PackageBuildError(
            f"pip resolved {meta['name']} to something other than a wheel: {url}"
        )
    return LockedWheel(name=str(meta["name"]), version=str(meta["version"]), url=url, sha256=sha256)


async def download(wheels: list[LockedWheel], target: GuestTarget, dest: Path) -> int:
    """Fetch the locked wheels into dest, each checked against its hash. Returns their bytes."""
    await check_pip()
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest.parent / "requirements.lock"
    requirements.write_text(
        "".join(f"{w.name} @ {w.url} --hash=sha256:{w.sha256}\n" for w in wheels)
    )
    result = await run_tool(
        pip_argv(
            "download",
            "--no-deps",
            "--require-hashes",
            "--progress-bar",
            "off",
            "--dest",
            str(dest),
            *target.pip_target_options(),
            "-r",
            str(requirements),
        ),
        timeout=DOWNLOAD_TIMEOUT_SECONDS,
        what="downloading the wheels with pip",
    )
    if result.returncode != 0:
        raise _pip_failure(result, target)
    files = list(dest.glob("*.whl"))
    if len(files) != len(wheels):
        raise PackageBuildError(f"pip downloaded {len(files)} wheels, {len(wheels)} were locked")
    return sum(f.stat().st_size for f in files)


async def unpack(wheel_dir: Path, target: GuestTarget, tree: Path) -> None:
    """Install the wheels into tree as the guest's site directory will hold them; console
    scripts (tree/bin) run the guest's python."""
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    result = await run_tool(
        pip_argv(
            "install",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--ignore-installed",
            "--no-warn-script-location",
            "--progress-bar",
            "off",
            "--target",
            str(tree),
            *target.pip_target_options(),
            *wheels,
        ),
        timeout=UNPACK_TIMEOUT_SECONDS,
        what="unpacking the wheels with pip",
    )
    if result.returncode != 0:
        raise PackageBuildError(f"unpacking the wheels failed: {result.tail()}")
    await asyncio.get_running_loop().run_in_executor(None, _point_scripts_at_guest, tree / "bin")


def _point_scripts_at_guest(bin_dir: Path) -> None:
    """pip wrote the host interpreter into the scripts' first line: the guest has its own."""
    if not bin_dir.is_dir():
        return
    for script in bin_dir.iterdir():
        if not script.is_file() or script.is_symlink():
            continue
        data = script.read_bytes()
        lines = data.split(b"\n")
        if lines[0].startswith(b"#!") and b"python" in lines[0]:
            body = b"\n".join(lines[1:])
        elif lines[0] == b"#!/bin/sh" and len(lines) > 2 and lines[1].startswith(b"'''exec'"):
            # pip's form for an interpreter path too long for a shebang line.
            body = b"\n".join(lines[3:]) if lines[2] == b"' '''" else b"\n".join(lines[2:])
        else:
            continue
        script.write_bytes(_SHEBANG_PYTHON + body)


@dataclass(frozen=True)
class BytecodePython:
    """How to start an interpreter whose bytecode the guest's python reads."""

    argv: list[str]
    env: dict[str, str]
    # compileall's worker processes re-run the interpreter by its path alone (a forkserver from
    # 3.13 on), which the image tree's python cannot be started as: one process for that one.
    workers: str = "0"


def bytecode_python(target: GuestTarget) -> BytecodePython | None:
    """A host interpreter whose bytecode the guest's reads: this one when its version is the
    guest's; else the image's own python, from its package tree through the tree's loader (as
    images/rootfs/finish-image.sh compiles the image); else python<version> on PATH when it
    starts (a version manager's shim may not); None when there is none."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == target.python:
        return BytecodePython([sys.executable], {})
    root = target.tree_root
    if root is not None:
        loader = root / "lib64" / "ld-linux-x86-64.so.2"
        python = root / "usr" / "bin" / f"python{target.python}"
        if loader.is_file() and python.is_file():
            libs = f"{root}/lib/x86_64-linux-gnu:{root}/usr/lib/x86_64-linux-gnu"
            argv = [str(loader), "--library-path", libs, str(python)]
            return BytecodePython(argv, {"PYTHONHOME": f"{root}/usr"}, workers="1")
    found = shutil.which(f"python{target.python}")
    if found is not None and _starts(found):
        return BytecodePython([found], {})
    return None


def _starts(python: str) -> bool:
    try:
        return (
            subprocess.run(
                [python, "-c", ""], capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


async def compile_bytecode(tree: Path, target: GuestTarget) -> bool:
    """Precompile the tree into hash-based .pyc files that are never checked against their
    source (the layer is read-only, and its timestamps are zeroed, which would make timestamp
    .pyc files stale: python would recompile every module it imports, in every VM). The file
    names in the bytecode are the guest's. Compiling runs no package code. False (with a
    warning) when no host interpreter of the guest's version exists: the layer then works,
    with slower imports."""
    python = await asyncio.to_thread(bytecode_python, target)  # may try a python: off the loop
    if python is None:
        log.warning(
            "no python%s on this host: the package layer is built without bytecode, "
            "so imports in the sandbox compile each module (slower)",
            target.python,
        )
        return False
    result = await run_tool(
        [
            *python.argv,
            "-I",
            "-m",
            "compileall",
            "-q",
            "-j",
            python.workers,
            "--invalidation-mode",
            "unchecked-hash",
            "-d",
            target.site_packages,
            str(tree),
        ],
        timeout=COMPILE_TIMEOUT_SECONDS,
        what="compiling the packages' bytecode",
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "", **python.env},
    )
    if result.returncode not in (0, 1):  # 1: some file is not valid python (test data), as pip does
        raise PackageBuildError(f"compiling bytecode failed: {result.tail()}")
    return True


def _pip_failure(result: ToolResult, target: GuestTarget) -> Exception:
    text = result.stderr + result.stdout
    # pip's own verdict, without the warnings around it (ignored index locations and the like).
    errors = "\n".join(line for line in text.splitlines() if line.startswith("ERROR:"))
    said = errors or result.tail()
    platform = f"CPython {target.python} on manylinux (glibc {target.glibc}) x86_64"
    if _NETWORK_TROUBLE.search(text):
        return PackageBuildError(f"the package index could not be reached: {result.tail()}")
    lines = [redact_urls(line) for line in errors.splitlines()]
    match = _NO_MATCH.search(text)
    if match is not None:
        return ToolRefused(
            f"no installable wheel of {match[1]} for the sandbox ({platform}): it does not "
            f"exist on the package index, or it is published as source only (the sandbox never "
            f"builds packages from source). pip said: {said}",
            lines,
        )
    if "ResolutionImpossible" in text or "conflict" in text.lower():
        return ToolRefused(f"the requested packages conflict: {said}", lines)
    if "hash" in text.lower() and "do not match" in text.lower():
        return PackageBuildError(
            f"a downloaded wheel does not match its locked hash: {result.tail()}"
        )
    return PackageBuildError(f"pip failed: {said}")
