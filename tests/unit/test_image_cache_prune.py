"""images/lib.sh `prune`: the image cache keeps the most recently used artefacts of each kind and
never deletes one used in the last hour."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "images" / "lib.sh"
HOUR = 3600


def make(path: Path, age_seconds: float) -> Path:
    path.write_bytes(b"x")
    at = time.time() - age_seconds
    os.utime(path, (at, at))
    return path


def prune(images_dir: Path, keep: int, pattern: str) -> None:
    script = f'source "{LIB}"; prune {keep} "$images_dir"/{pattern}'
    env = {**os.environ, "EXEC_SANDBOX_IMAGES_DIR": str(images_dir), "EXEC_SANDBOX_QUIET": "1"}
    subprocess.run(["bash", "-c", script], check=True, env=env)


def test_keeps_the_most_recent_and_deletes_old_ones(tmp_path: Path) -> None:
    names = [f"rootfs-{i:016x}.erofs" for i in range(5)]
    # Newest first: 0 is 2 h old, 4 is 6 h old.
    for i, name in enumerate(names):
        make(tmp_path / name, (2 + i) * HOUR)
    other = make(tmp_path / "vmlinux-0000000000000000", 9 * HOUR)
    prune(tmp_path, 2, "rootfs-????????????????.erofs")
    assert sorted(p.name for p in tmp_path.glob("rootfs-*")) == sorted(names[:2])
    assert other.exists(), "another kind of artefact was pruned"


def test_never_deletes_what_was_used_in_the_last_hour(tmp_path: Path) -> None:
    recent = [make(tmp_path / f"rootfs-{i:016x}.erofs", 60 * (i + 1)) for i in range(4)]
    prune(tmp_path, 1, "rootfs-????????????????.erofs")
    assert all(p.exists() for p in recent)


def test_kernel_config_goes_with_its_kernel(tmp_path: Path) -> None:
    new = make(tmp_path / "vmlinux-1111111111111111", 2 * HOUR)
    old = make(tmp_path / "vmlinux-2222222222222222", 5 * HOUR)
    old_config = make(tmp_path / "vmlinux-2222222222222222.config", 5 * HOUR)
    prune(tmp_path, 1, "vmlinux-????????????????")
    assert new.exists()
    assert not old.exists() and not old_config.exists()


def test_reuse_marks_an_artefact_recent(tmp_path: Path) -> None:
    old = make(tmp_path / "rootfs-3333333333333333.erofs", 5 * HOUR)
    newer = make(tmp_path / "rootfs-4444444444444444.erofs", 2 * HOUR)
    env = {**os.environ, "EXEC_SANDBOX_IMAGES_DIR": str(tmp_path), "EXEC_SANDBOX_QUIET": "1"}
    subprocess.run(["bash", "-c", f'source "{LIB}"; reuse "{old}"'], check=True, env=env)
    assert old.stat().st_mtime > newer.stat().st_mtime
    prune(tmp_path, 1, "rootfs-????????????????.erofs")
    assert old.exists(), "the artefact just reused was pruned"
    assert not newer.exists()
