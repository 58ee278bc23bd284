"""The memory snapshot cache stays bounded: SnapshotCache.prune() keeps the most recently used
snapshot directories and removes leftovers of killed processes, nothing else."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from exec_sandbox.snapshots.l1 import KEEP_SNAPSHOTS, LEFTOVER_AGE_SECONDS, SnapshotCache


def _key(i: int) -> str:
    return f"python-192m-{i:024x}"


def _make(root: Path, name: str, age_seconds: float) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "ram").write_bytes(b"x")
    at = time.time() - age_seconds
    os.utime(directory, (at, at))
    return directory


def test_keeps_the_most_recently_used_and_the_protected_one(tmp_path: Path) -> None:
    # Twelve snapshots, used one minute apart: key 0 most recently.
    for i in range(12):
        _make(tmp_path, _key(i), 60 * i)
    removed = SnapshotCache(tmp_path).prune(protect=_key(11))
    left = sorted(p.name for p in tmp_path.iterdir())
    # The protected one (just published) stays although it is the oldest, plus the 7 newest.
    assert left == sorted([_key(11)] + [_key(i) for i in range(KEEP_SNAPSHOTS - 1)])
    assert sorted(removed) == sorted(_key(i) for i in range(KEEP_SNAPSHOTS - 1, 11))
    # Without protection the plain LRU order applies.
    SnapshotCache(tmp_path).prune(keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [_key(0), _key(1), _key(2)]


def test_removes_old_leftovers_but_not_live_builds_nor_foreign_entries(tmp_path: Path) -> None:
    old = LEFTOVER_AGE_SECONDS + 60
    dead_build = _make(tmp_path, f".build-{_key(1)}-k1ll3d_x", old)
    dead_trash = _make(tmp_path, ".trash-abc123_x", old)
    fresh_build = _make(tmp_path, f".build-{_key(2)}-fresh000", 10)
    fresh_trash = _make(tmp_path, ".trash-fresh000", 10)
    live_build = _make(tmp_path, f".build-{_key(3)}-l1ve0000", old)
    # Entries this module never makes stay whatever their age (the cache dir could be shared).
    foreign = [_make(tmp_path, name, old) for name in ("photos", ".build-notes", "python-old")]
    (tmp_path / "python-192m-notadirectory").write_text("x")
    lock = os.open(live_build, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # what a builder in another process holds
        removed = SnapshotCache(tmp_path).prune()
    finally:
        os.close(lock)
    assert sorted(removed) == sorted([dead_build.name, dead_trash.name])
    assert not dead_build.exists() and not dead_trash.exists()
    assert fresh_build.exists() and fresh_trash.exists() and live_build.exists()
    assert all(p.exists() for p in foreign)
    assert (tmp_path / "python-192m-notadirectory").is_file()
    # Once its builder is gone, the old build directory goes too.
    assert SnapshotCache(tmp_path).prune() == [live_build.name]


def test_missing_cache_dir_is_not_an_error(tmp_path: Path) -> None:
    assert SnapshotCache(tmp_path / "absent").prune() == []
