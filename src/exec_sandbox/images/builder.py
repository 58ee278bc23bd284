"""`sbx setup`: build (or verify) the guest kernel and root image into the images directory the
library reads, from the recipe installed with the package. No source tree is needed.

The recipe is images/build.sh and what it uses (kernel config and patches, root package list, the
guest agent's C sources, the session REPL drivers), copied into the wheel as
exec_sandbox/_recipe/ by setup.py with the repository's layout; in a source checkout without that
copy, the checkout itself. The scripts cache every artefact by the hash of its inputs, so a second
run only verifies (seconds). They print `[images HH:MM:SS] <step>` lines on stderr, which this
module turns into a step counter with elapsed times on a terminal.

Before building, the host is checked for every tool the build runs; a missing one stops the build
with the exact `apt-get install` line (`--install-deps` runs it).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..paths import images_dir
from .catalog import GuestImages, load_images

# Free space a build from nothing needs in the images directory: the kernel's source and objects
# (~2.5 GB while compiling), the package tree and two root images (~0.3 GB each).
FULL_BUILD_BYTES = 4 * 1024**3


def recipe_root() -> Path:
    """The directory holding images/build.sh: the installed copy, else the source checkout."""
    package = Path(__file__).resolve().parents[1]  # exec_sandbox/
    for root in (package / "_recipe", package.parents[1]):
        if (root / "images" / "build.sh").is_file():
            return root
    raise FileNotFoundError(
        f"the image recipe is missing from {package / '_recipe'}: reinstall exec-sandbox"
    )


@dataclass(frozen=True)
class Requirement:
    """Something the build needs: found by `probe`, installed by the Debian package `package`."""

    what: str  # what the build uses it for
    package: str
    probe: Callable[[], bool]


def _tool(name: str) -> Callable[[], bool]:
    return lambda: shutil.which(name) is not None


def _file(path: str) -> Callable[[], bool]:
    return lambda: os.path.exists(path)


def _pip_available() -> bool:
    """This python (the one `sbx setup` runs under, which fetches the pinned wheels) has pip."""
    return importlib.util.find_spec("pip") is not None


def _apt_knows(package: str) -> Callable[[], bool]:
    """Installed, or apt can download it (build-kernel.sh fetches linux-source as a .deb)."""

    def probe() -> bool:
        if os.path.exists(f"/usr/src/{package}.tar.xz"):  # installed: build-kernel.sh uses it
            return True
        if shutil.which("apt-cache") is None:
            return False
        out = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", package],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return "\nVersion: " in "\n" + out

    return probe


REQUIREMENTS = [
    Requirement("C compiler (agent, kernel)", "build-essential", _tool("gcc")),
    Requirement("make", "build-essential", _tool("make")),
    Requirement("static C library (agent)", "libc6-dev", _file("/usr/lib/x86_64-linux-gnu/libc.a")),
    Requirement("bc (kernel)", "bc", _tool("bc")),
    Requirement("bison (kernel)", "bison", _tool("bison")),
    Requirement("flex (kernel)", "flex", _tool("flex")),
    Requirement("libelf headers (kernel objtool)", "libelf-dev", _file("/usr/include/gelf.h")),
    Requirement("OpenSSL headers (kernel)", "libssl-dev", _file("/usr/include/openssl/ssl.h")),
    Requirement("patch (kernel patches)", "patch", _tool("patch")),
    Requirement("xz (kernel source)", "xz-utils", _tool("xz")),
    Requirement("dpkg-deb (kernel source package)", "dpkg", _tool("dpkg-deb")),
    Requirement("apt-get (package downloads)", "apt", _tool("apt-get")),
    Requirement(
        "linux-source-6.1 in apt's package lists (kernel source)",
        "linux-source-6.1",
        _apt_knows("linux-source-6.1"),
    ),
    Requirement("mmdebstrap (root file system)", "mmdebstrap", _tool("mmdebstrap")),
    Requirement("mkfs.erofs (root image)", "erofs-utils", _tool("mkfs.erofs")),
    Requirement("unzip (the image's pinned node wheel)", "unzip", _tool("unzip")),
    Requirement("pip (the image's pinned node wheel)", "python3-pip", _pip_available),
]
# Only for a build without root: mmdebstrap's user namespace maps the user's subordinate ids.
UNPRIVILEGED_REQUIREMENTS = [
    Requirement("newuidmap (unprivileged root file system)", "uidmap", _tool("newuidmap")),
    Requirement("newgidmap (unprivileged root file system)", "uidmap", _tool("newgidmap")),
]


def _is_root() -> bool:
    return os.geteuid() == 0


def missing_packages() -> list[tuple[str, str]]:
    """(what, package) for each requirement not met on this host."""
    reqs = REQUIREMENTS + ([] if _is_root() else UNPRIVILEGED_REQUIREMENTS)
    return [(r.what, r.package) for r in reqs if not r.probe()]


def apt_install_line(packages: list[str]) -> str:
    sudo = "" if _is_root() else "sudo "
    names = " ".join(dict.fromkeys(packages))  # in order, once each
    return f"{sudo}apt-get install -y --no-install-recommends {names}"


def user_namespace_problem() -> str | None:
    """Why an unprivileged build cannot make its user namespace, with the fix; None if it can (or
    this is root, which needs none)."""
    if _is_root():
        return None
    user = _user_name()
    for db in ("/etc/subuid", "/etc/subgid"):
        try:
            entries = Path(db).read_text().splitlines()
        except OSError:
            entries = []
        if not any(e.split(":")[0] in (user, str(os.getuid())) for e in entries):
            return (
                f"{db} has no range for {user}: sudo usermod --add-subuids 100000-165535 "
                f"--add-subgids 100000-165535 {user}"
            )
    try:
        proc = subprocess.run(
            ["unshare", "--user", "true"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot try a user namespace: {exc}"
    if proc.returncode != 0:
        return (
            f"user namespaces are not allowed for unprivileged users here "
            f"({proc.stderr.strip()}): run sbx setup as root (sudo), or allow them "
            "(sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces)"
        )
    return None


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def free_bytes(path: Path) -> int:
    """Free space for this user on the file system that holds path (or its nearest parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class SetupError(Exception):
    """`sbx setup` cannot go on; the message says what to do."""


def install_packages(packages: list[str], out: TextIO) -> None:
    """Run the apt line (with sudo when not root), printing it first."""
    line = apt_install_line(packages)
    print(f"sbx setup: running {line}", file=out, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(line.split(), env=env, check=False).returncode != 0:
        raise SetupError(
            f"`{line}` failed; if apt cannot find a package, run "
            f"`{'' if _is_root() else 'sudo '}apt-get update` first"
        )


def check_host(install_deps: bool, out: TextIO) -> None:
    missing = missing_packages()
    if missing and install_deps:
        install_packages([pkg for _, pkg in missing], out)
        missing = missing_packages()
    if missing:
        lines = "\n".join(f"  {what}: package {pkg}" for what, pkg in missing)
        raise SetupError(
            f"the image build needs tools this host lacks:\n{lines}\ninstall them "
            f"with:\n  {apt_install_line([p for _, p in missing])}\n"
            "(or run `sbx setup --install-deps`)"
        )
    problem = user_namespace_problem()
    if problem:
        raise SetupError(
            f"building the root file system without root needs a user namespace: {problem}"
        )


_STEP = re.compile(r"^\[images(?: [0-9:]+)?\] (.*)$")
_DETAIL = "[images-detail] "
# Which of the build's three parts a step line belongs to (build.sh runs them in this order).
_PARTS = (("guest agent", "guest agent"), ("kernel", "kernel"), ("rootfs", "root file system"))


class _Display:
    """What the user sees of the build. On a terminal: the current step on one line with the step
    counter and its elapsed time (updated every second), each finished step kept as a line with
    its duration. Elsewhere, or quiet: nothing (errors are reported by the caller)."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        self._stream = stream
        self._live = live
        self._lock = threading.Lock()
        self._step: str | None = None
        self._part = 0
        self._detail = ""
        self._step_started = self._started = time.monotonic()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        if live:
            self._ticker.start()

    def step(self, text: str) -> None:
        with self._lock:
            self._finish_step()
            for i, (prefix, _) in enumerate(_PARTS, 1):
                if text.startswith(prefix):
                    self._part = i
            self._step, self._detail = text, ""
            self._step_started = time.monotonic()
            self._draw()

    def detail(self, text: str) -> None:
        with self._lock:
            self._detail = text
            self._draw()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._finish_step()
        if self._live:
            self._ticker.join()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw()

    def _prefix(self) -> str:
        return f"[{self._part}/{len(_PARTS)}]" if self._part else "[setup]"

    def _draw(self) -> None:
        if not self._live or self._step is None:
            return
        now = time.monotonic()
        line = f"{self._prefix()} {self._step}  {_clock(now - self._step_started)}"
        if self._detail:
            line += f"  {self._detail}"
        width = shutil.get_terminal_size().columns - 1
        self._stream.write(f"\r\033[K{line[:width]}")
        self._stream.flush()

    def _finish_step(self) -> None:
        if self._live and self._step is not None:
            took = _clock(time.monotonic() - self._step_started)
            self._stream.write(f"\r\033[K{self._prefix()} {self._step}  {took}\n")
            self._stream.flush()
        self._step = None


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


def run_build(*, quiet: bool, stream: TextIO) -> GuestImages:
    """Run images/build.sh; returns the images it recorded. Raises SetupError on failure."""
    target = images_dir()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SetupError(f"cannot create the images directory {target}: {exc}") from None
    script = recipe_root() / "images" / "build.sh"
    live = not quiet and stream.isatty()
    env = {**os.environ, "EXEC_SANDBOX_IMAGES_DIR": str(target), "EXEC_SANDBOX_PROGRESS": "1"}
    # The pinned wheels of the image (node) come through this python's pip: the host's own index
    # configuration, the same pip that builds package layers.
    env["EXEC_SANDBOX_PYTHON"] = sys.executable
    env.pop("EXEC_SANDBOX_QUIET", None)
    display = _Display(stream, live)
    other: list[str] = []  # the scripts' own messages: errors, a failed command's log tail
    proc = subprocess.Popen(
        ["bash", str(script)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        errors="replace",
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            line = line.rstrip("\n")
            match = _STEP.match(line)
            if line.startswith(_DETAIL):
                display.detail(line[len(_DETAIL) :].strip())
            elif match:
                display.step(match.group(1))
            else:
                other.append(line)
        status = proc.wait()
    except KeyboardInterrupt:
        # The scripts got the same Ctrl-C: they remove their staging directories; nothing half
        # built is ever renamed into the cache.
        proc.wait()
        display.close()
        raise
    display.close()
    if status != 0:
        raise SetupError(_failure_message(status, other, target))
    images = load_images(target)
    return images


def _failure_message(status: int, output: list[str], target: Path) -> str:
    text = "\n".join(output[-60:])
    free = free_bytes(target)
    if "No space left on device" in text or free < 256 * 1024**2:
        return (
            f"the disk holding {target} is full ({free // 1024**2} MB free): a build from "
            f"nothing needs about {FULL_BUILD_BYTES // 1024**3} GB. Free some space (or set "
            "EXEC_SANDBOX_IMAGES_DIR to a larger disk) and run `sbx setup` again; what was "
            "built so far is kept, nothing half-built is"
        )
    return f"the image build failed (status {status}):\n{text}"


def main(*, quiet: bool, install_deps: bool, out: TextIO = sys.stderr) -> int:
    """`sbx setup`: 0 when the images are ready, 1 otherwise."""
    started = time.monotonic()
    try:
        check_host(install_deps, out)
        images = run_build(quiet=quiet, stream=out)
    except SetupError as exc:
        print(f"sbx setup: {exc}", file=out)
        return 1
    except FileNotFoundError as exc:
        print(f"sbx setup: {exc}", file=out)
        return 1
    except KeyboardInterrupt:
        print(
            "\nsbx setup: interrupted; nothing half-built was kept. Run `sbx setup` again to "
            "go on: finished parts are cached",
            file=out,
        )
        return 130
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            print(f"sbx setup: disk full: {exc}", file=out)
            return 1
        raise
    if not quiet:
        took = _clock(time.monotonic() - started)
        print(
            f"sbx setup: guest images ready in {images.kernel.parent} ({took}): "
            f"kernel {images.kernel.name}, root {images.rootfs.name}",
            file=out,
        )
    return 0
