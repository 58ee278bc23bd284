"""`pip install exec-sandbox` is the whole install: the sdist builds a wheel that carries the image
recipe; installed into a fresh virtualenv outside the checkout, with a fresh HOME, `sbx setup`
builds the images from the installed recipe and `sbx run` boots the guest's own kernel.

The fresh images directory is seeded with the checkout's kernel and Debian package tree (links to
the already-built ones: the content-hash cache finds them), so the test compiles no kernel; it
still compiles the agent from the installed sources and packs the root image, and checks that
the result is the very image a checkout builds (one recipe, reproducible agent)."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exec_sandbox.images.catalog import MANIFEST_NAME
from exec_sandbox.paths import images_dir

# The first test to need the installed package builds it (sdist, wheel, venv, sbx setup).
pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]
CHECKOUT = Path(__file__).resolve().parents[3]
# What `sbx setup` needs from the package: the recipe, laid out like the repository.
RECIPE = [
    "images/build.sh",
    "images/build-kernel.sh",
    "images/build-rootfs.sh",
    "images/lib.sh",
    "images/kernel/compile.sh",
    "images/kernel/sandbox.config",
    "images/kernel/patches/0001-x86-apic-lapic_timer_khz.patch",
    "images/rootfs/packages.txt",
    "images/rootfs/make-tree.sh",
    "images/rootfs/finish-image.sh",
    "guest/Makefile",
    "guest/src/main.c",
    "guest/src/agent.h",
    "guest/repl/driver.py",
    "guest/repl/driver.js",
    "guest/repl/driver.sh",
    "guest/runtime/node/tools.js",
    "guest/runtime/node/tools_global.js",
    "guest/runtime/python/exec_sandbox_guest.pth",
    "guest/runtime/python/exec_sandbox_guest/__init__.py",
    "guest/runtime/python/exec_sandbox_guest/mpl_backend.py",
    "src/shared/protocol.h",
    "src/shared/frame.c",
]


@dataclass(frozen=True)
class Installed:
    root: Path
    sdist: Path
    wheel: Path
    venv: Path
    home: Path
    env: dict[str, str]
    checkout_manifest: dict[str, object]
    setup: subprocess.CompletedProcess[str]


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, **kw
    )
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def fresh_env(home: Path, venv: Path) -> dict[str, str]:
    """A new user's environment: the venv's bin first, no variable pointing into the checkout."""
    keep = ("PATH", "LANG", "TERM", "EXEC_SANDBOX_ACCEL", "EXEC_SANDBOX_QEMU")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


def seed_cache(target: Path, checkout_manifest: dict[str, object]) -> None:
    """Link the checkout's kernel and package tree into a fresh images directory."""
    source = images_dir()
    target.mkdir(parents=True)
    kernel = Path(str(checkout_manifest["kernel"]))
    guest = checkout_manifest["guest"]
    assert isinstance(guest, dict)
    tree = source / f"rootfs-tree-{guest['tree']}"
    assert kernel.is_file() and tree.is_dir(), "the checkout's images are incomplete: make images"
    (target / kernel.name).symlink_to(kernel)
    (target / tree.name).symlink_to(tree)


def build_and_install(root: Path) -> Installed:
    dist = root / "dist"
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(CHECKOUT)])
    (sdist,) = dist.glob("exec_sandbox-*.tar.gz")
    # The wheel is built from the sdist, not the checkout: proves the sdist carries everything.
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(sdist)],
        cwd=root,
    )
    (wheel,) = dist.glob("exec_sandbox-*.whl")
    # Its dependencies' wheels beside it, from the index this host's pip uses: the installs
    # below take nothing from anywhere but dist.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--only-binary=:all:",
            "-d",
            str(dist),
            str(wheel),
        ],
        cwd=root,
    )
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=root)
    run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(dist),
            str(wheel),
        ],
        cwd=root,
    )
    home = root / "home"
    home.mkdir()
    env = fresh_env(home, venv)
    checkout_manifest = json.loads((images_dir() / MANIFEST_NAME).read_text())
    seed_cache(home / ".cache" / "exec-sandbox" / "images", checkout_manifest)
    setup = subprocess.run(
        [str(venv / "bin" / "sbx"), "setup"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return Installed(root, sdist, wheel, venv, home, env, checkout_manifest, setup)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """Built once per test run, whichever xdist worker comes first (the others wait on a lock)."""
    manifest = images_dir() / MANIFEST_NAME
    assert manifest.is_file(), f"{manifest} missing: run `make images` before the VM tests"
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is popen-gwN inside this run's directory.
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "pip-install"
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "done.json"
        if not done.exists():
            result = build_and_install(root)
            done.write_text(
                json.dumps(
                    {
                        "returncode": result.setup.returncode,
                        "stdout": result.setup.stdout,
                        "stderr": result.setup.stderr,
                    }
                )
            )
        recorded = json.loads(done.read_text())
    venv, home = root / "venv", root / "home"
    dist = root / "dist"
    yield Installed(
        root=root,
        sdist=next(dist.glob("exec_sandbox-*.tar.gz")),
        wheel=next(dist.glob("exec_sandbox-*.whl")),
        venv=venv,
        home=home,
        env=fresh_env(home, venv),
        checkout_manifest=json.loads((images_dir() / MANIFEST_NAME).read_text()),
        setup=subprocess.CompletedProcess(
            [], recorded["returncode"], recorded["stdout"], recorded["stderr"]
        ),
    )


def test_sdist_and_wheel_carry_the_image_recipe(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    with zipfile.ZipFile(installed.wheel) as wheel:
        in_wheel = set(wheel.namelist())
    for path in RECIPE:
        assert path in in_sdist, f"{path} missing from the sdist"
        assert f"exec_sandbox/_recipe/{path}" in in_wheel, f"{path} missing from the wheel"


def test_installed_package_runs_outside_the_checkout(installed: Installed) -> None:
    proc = run(
        [
            str(installed.venv / "bin" / "python"),
            "-c",
            "import exec_sandbox, exec_sandbox.images.builder as b; "
            "print(exec_sandbox.__file__); print(b.recipe_root())",
        ],
        cwd=installed.root,
        env=installed.env,
    )
    for line in proc.stdout.split():
        assert Path(line).is_relative_to(installed.venv), line
        assert not Path(line).is_relative_to(CHECKOUT), line


def test_setup_from_the_wheel_builds_the_checkouts_images(installed: Installed) -> None:
    assert installed.setup.returncode == 0, installed.setup.stderr
    manifest = json.loads(
        (installed.home / ".cache/exec-sandbox/images" / MANIFEST_NAME).read_text()
    )
    # The seeded kernel was found by its hash (no compile), and the root image packed from the
    # installed recipe has the checkout's key: the same agent binary, drivers and finishing.
    assert manifest["kernel_hash"] == installed.checkout_manifest["kernel_hash"]
    assert manifest["rootfs_hash"] == installed.checkout_manifest["rootfs_hash"]
    assert Path(manifest["rootfs"]).is_relative_to(installed.home)


def test_second_setup_only_verifies(installed: Installed) -> None:
    started = time.monotonic()
    proc = run(
        [str(installed.venv / "bin" / "sbx"), "setup"],
        cwd=installed.root,
        env=installed.env,
        timeout=120,
    )
    assert time.monotonic() - started < 20, proc.stderr
    assert "guest images ready" in proc.stderr


def test_sbx_run_boots_the_guest_kernel(installed: Installed) -> None:
    proc = run(
        [
            str(installed.venv / "bin" / "sbx"),
            "run",
            "--no-snapshot-wait",
            "-c",
            "import platform; print(platform.release())",
        ],
        cwd=installed.root,
        env=installed.env,
        timeout=180,
    )
    guest_release = proc.stdout.strip()
    assert guest_release and guest_release != os.uname().release, proc.stdout


TEST_USER = "sbx-setup-test"


def unprivileged_user() -> pwd.struct_passwd:
    """The test user (created if missing, with subordinate ids), or skip where that is not
    possible or user namespaces are not allowed."""
    if os.geteuid() != 0:
        pytest.skip("creating the unprivileged test user needs root")
    try:
        user = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
            check=True,
        )
        user = pwd.getpwnam(TEST_USER)
    for db, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        if not any(line.startswith(f"{TEST_USER}:") for line in Path(db).read_text().splitlines()):
            subprocess.run(["usermod", flag, "300000-365535", TEST_USER], check=True)
    probe = subprocess.run(
        [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            "unshare",
            "--user",
            "true",
        ],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip("this host does not allow unprivileged user namespaces")
    return user


@pytest.mark.timeout(900)
def test_setup_as_an_unprivileged_user(installed: Installed) -> None:
    """The package tree is built in a user namespace (mmdebstrap --mode=unshare), packed there,
    and the image boots with root-owned system files. Only the kernel is seeded (copied: the
    checkout's cache may not be readable by the user)."""
    user = unprivileged_user()
    root = Path(tempfile.mkdtemp(prefix="sbx-unprivileged-", dir="/tmp"))
    try:
        os.chown(root, user.pw_uid, user.pw_gid)
        wheel = root / installed.wheel.name
        shutil.copy(installed.wheel, wheel)
        for dependency in installed.wheel.parent.glob("*.whl"):  # h11 and the like
            if dependency != installed.wheel:
                shutil.copy(dependency, root / dependency.name)
        images = root / "home" / ".cache" / "exec-sandbox" / "images"
        images.mkdir(parents=True)
        kernel = Path(str(installed.checkout_manifest["kernel"]))
        shutil.copy(kernel, images / kernel.name)
        for path in [
            root / "home",
            root / "home" / ".cache",
            images.parent,
            images,
            images / kernel.name,
            wheel,
        ]:
            os.chown(path, user.pw_uid, user.pw_gid)
        # The system's python and PATH: the test's own interpreter may live where the user cannot
        # read (a pyenv under /root).
        env = {
            "HOME": str(root / "home"),
            "LANG": "C.UTF-8",
            "PATH": f"{root / 'venv' / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        }
        python = shutil.which("python3", path="/usr/bin:/bin")
        assert python, "no system python3"
        as_user = [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            "--reset-env",
        ]

        def run_as_user(*cmd: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
            return run(
                [*as_user, "env", *(f"{k}={v}" for k, v in env.items()), *cmd],
                cwd=root,
                timeout=timeout,
            )

        run_as_user(python, "-m", "venv", str(root / "venv"))
        run_as_user(
            str(root / "venv/bin/pip"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(wheel.parent),
            str(wheel),
        )
        run_as_user(str(root / "venv/bin/sbx"), "setup", timeout=840)
        manifest = json.loads((images / MANIFEST_NAME).read_text())
        assert manifest["kernel_hash"] == installed.checkout_manifest["kernel_hash"]
        # Seen from the host, the tree belongs to the user's subordinate ids; in the image, the
        # system files are root's and the agent is where the VM starts it.
        proc = run_as_user(
            str(root / "venv/bin/sbx"),
            "run",
            "--no-snapshot-wait",
            "-c",
            "import os; print(os.stat('/usr/bin').st_uid, "
            "os.stat('/etc/shadow').st_uid, os.stat('/etc/shadow').st_mode & 0o7)",
            timeout=180,
        )
        assert proc.stdout.split() == ["0", "0", "0"], proc.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)
