"""What the on-disk caches of built things share (packages/store.py, templates/store.py): a
private build directory per build on the cache's own file system (so that publishing is a
rename or a link), locked while in use and removed afterwards; the build lock of one key across
processes; JSON written whole or not at all.

A process killed mid-build leaves its directory behind: the next build removes those older than
an hour whose lock nobody holds."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ._threads import in_thread

STALE_BUILD_SECONDS = 3600.0
_LOCK_POLL_SECONDS = 0.1


@contextlib.asynccontextmanager
async def build_dir(root: Path) -> AsyncIterator[Path]:
    """A fresh private directory under root for one build, removed afterwards (what was
    published was renamed or linked out of it). Locked while in use, so that another process's
    cleanup of stale builds leaves it alone."""
    path, fd = await in_thread(
        functools.partial(_new_build, root), discard=lambda built: _remove_build(*built)
    )
    try:
        yield path
    finally:
        await in_thread(functools.partial(_remove_build, path, fd))


@contextlib.asynccontextmanager
async def build_lock(path: Path, on_wait: Callable[[], None] | None = None) -> AsyncIterator[None]:
    """Hold the flock of the file at path (created as needed): one build of a key at a time,
    across processes; polled, never blocking the loop. on_wait is called once if another holds
    it (someone may want to say why nothing happens)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                    on_wait = None
                await asyncio.sleep(_LOCK_POLL_SECONDS)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_json_atomically(path: Path, data: Any) -> None:
    """path holds data as JSON, whole: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def remove_stale_builds(root: Path) -> None:
    """Build directories under root older than STALE_BUILD_SECONDS whose lock nobody holds, and
    what a removal renamed aside (`.trash-*`) and could not finish."""
    now = time.time()
    for path in root.glob(".build-*"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime < STALE_BUILD_SECONDS:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live build
            finally:
                os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(".trash-*"):
        shutil.rmtree(path, ignore_errors=True)


def _new_build(root: Path) -> tuple[Path, int]:
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    remove_stale_builds(root)
    path = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


def _remove_build(path: Path, lock_fd: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.close(lock_fd)  # releases the build directory's lock
