"""`sbx setup` checks the host before building: a missing build tool stops it at once with the
exact apt-get line that installs it, and nothing is built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from exec_sandbox.images import builder


def path_without(tmp_path: Path, *removed: str) -> str:
    """A PATH of one directory holding a link to every tool the build checks for, but `removed`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wanted = {
        "gcc",
        "make",
        "bc",
        "bison",
        "flex",
        "patch",
        "xz",
        "dpkg-deb",
        "apt-get",
        "apt-cache",
        "mmdebstrap",
        "mkfs.erofs",
        "newuidmap",
        "newgidmap",
        "unshare",
    }
    for name in wanted - set(removed):
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


def test_missing_tool_stops_setup_with_the_apt_line(tmp_path: Path) -> None:
    images = tmp_path / "images"
    env = {
        **os.environ,
        "PATH": path_without(tmp_path, "mkfs.erofs"),
        "EXEC_SANDBOX_IMAGES_DIR": str(images),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli.main", "setup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    sudo = "" if os.geteuid() == 0 else "sudo "
    assert f"{sudo}apt-get install -y --no-install-recommends erofs-utils" in proc.stderr
    assert "mkfs.erofs" in proc.stderr
    assert not images.exists() or not any(images.iterdir()), "setup built something anyway"


def test_apt_line_names_each_package_once() -> None:
    line = builder.apt_install_line(["bison", "flex", "bison"])
    assert line.endswith("apt-get install -y --no-install-recommends bison flex")


def test_recipe_is_found() -> None:
    root = builder.recipe_root()
    for part in (
        "images/build.sh",
        "images/kernel/sandbox.config",
        "guest/Makefile",
        "guest/repl/driver.py",
        "src/shared/protocol.h",
    ):
        assert (root / part).is_file(), part
