"""The on-disk cache of package layers (SchedulerConfig.package_cache_dir).

```
requests/<request-key>.json   a packages request -> the lock it resolved to (no resolver run,
                              nothing downloaded, when the same request comes again)
layers/<layer-key>/           layer.erofs (or layer.tar: what an install into a running VM
                              unpacks) + meta.json (the lock, size, SHA-256 of the file)
locks/<layer-key>.lock        flock: one build of a key at a time, across processes
.build-*/                     a build in progress; published into layers/ by one rename
```

A layer directory is complete or absent: it is built aside and renamed into place, never
written after. A layer whose size or digest does not match its meta is damaged: it is moved
away and built again. The digest is checked once per process and file (hashing hundreds of MB on
every use would cost more than the VM); the size on every use. Eviction keeps the most recently
used layers under a size cap; "used" is the directory's mtime, refreshed on each use.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._cache_dirs import build_dir, build_lock, write_json_atomically
from .._threads import in_thread
from ..digest import file_sha256

log = logging.getLogger("exec_sandbox")

LAYER_FILE = "layer.erofs"
ARCHIVE_FILE = "layer.tar"
META_FILE = "meta.json"
# Leftovers of a killed builder older than this, and not locked, are removed.
# A layer used this recently is never evicted: a VM may be about to open it by path.
_EVICT_GRACE_SECONDS = 600.0
_REQUESTS_KEEP = 2000


@dataclass(frozen=True)
class StoredLayer:
    key: str
    path: Path  # the EROFS image
    meta: dict[str, Any]

    @property
    def size(self) -> int:
        return int(self.meta["size"])


class LayerStore:
    """The layer cache of one directory. Its disk work (reading metas, hashing and removing
    images of hundreds of MB) runs in executor threads: every public method is a coroutine that
    leaves the event loop free while it waits; the `_`-prefixed blocking steps run in those
    threads."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        # (device, inode, mtime, size) of images whose digest this process has checked.
        self._verified: set[tuple[int, int, int, int]] = set()

    async def read_request(self, request_key: str) -> dict[str, Any] | None:
        """The lock a packages request resolved to last time, if it is cached."""
        return await in_thread(functools.partial(self._read_request, request_key))

    async def write_request(self, request_key: str, lock: dict[str, Any]) -> None:
        await in_thread(functools.partial(self._write_request, request_key, lock))

    async def lookup(self, key: str) -> StoredLayer | None:
        """The published layer of key if its meta reads and its image has the recorded size;
        a damaged one is moved away (and None returned)."""
        return await in_thread(functools.partial(self._lookup, key))

    async def publish(self, key: str, image: Path, meta: dict[str, Any]) -> StoredLayer:
        """Move a built image into the cache as key (complete or not at all), then evict."""
        return await in_thread(functools.partial(self._publish, key, image, meta))

    async def evict(self, keep: str | None = None) -> None:
        """Remove least recently used layers until the cache is under its size cap."""
        await in_thread(functools.partial(self._evict, keep))

    def build_dir(self) -> contextlib.AbstractAsyncContextManager[Path]:
        """A fresh private directory for one build on the store's file system, removed
        afterwards (what was published was moved out of it); _cache_dirs.build_dir."""
        return build_dir(self.root)

    def build_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the build lock of key (across processes); _cache_dirs.build_lock."""
        return build_lock(self._dir("locks") / f"{key}.lock")

    # --- the blocking steps, run in executor threads ---

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def _read_request(self, request_key: str) -> dict[str, Any] | None:
        path = self._dir("requests") / f"{request_key}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def _write_request(self, request_key: str, lock: dict[str, Any]) -> None:
        directory = self._dir("requests")
        write_json_atomically(directory / f"{request_key}.json", lock)
        entries = sorted(directory.glob("*.json"), key=_mtime, reverse=True)
        for stale in entries[_REQUESTS_KEEP:]:
            with contextlib.suppress(OSError):
                stale.unlink()

    def _lookup(self, key: str) -> StoredLayer | None:
        directory = self._dir("layers") / key
        try:
            meta = json.loads((directory / META_FILE).read_text())
            size = _layer_file(directory).stat().st_size
        except FileNotFoundError:
            if directory.exists():
                self._discard(key, "incomplete")
            return None
        except (OSError, ValueError) as exc:
            self._discard(key, f"unreadable: {exc}")
            return None
        if not isinstance(meta, dict) or meta.get("size") != size:
            self._discard(key, f"image is {size} bytes, its meta says {meta.get('size')}")
            return None
        with contextlib.suppress(OSError):
            os.utime(directory)
        return StoredLayer(key, _layer_file(directory), meta)

    async def verify(self, layer: StoredLayer) -> bool:
        """Whether the image's bytes are what was built (SHA-256, once per process and file);
        a mismatch discards the layer."""
        try:
            info = layer.path.stat()
        except OSError:
            return False
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
        if identity in self._verified:
            return True
        digest = await in_thread(functools.partial(file_sha256, layer.path))
        if digest != layer.meta.get("sha256"):
            await in_thread(
                functools.partial(self._discard, layer.key, "its SHA-256 does not match its meta")
            )
            return False
        self._verified.add(identity)
        return True

    def _discard(self, key: str, why: str) -> None:
        log.warning("package layer %s is damaged (%s): it is removed and will be rebuilt", key, why)
        self._remove(self.root / "layers" / key)

    def _publish(self, key: str, image: Path, meta: dict[str, Any]) -> StoredLayer:
        staging = image.parent / "publish"
        staging.mkdir()
        name = ARCHIVE_FILE if image.suffix == ".tar" else LAYER_FILE
        image.rename(staging / name)
        write_json_atomically(staging / META_FILE, meta)
        os.chmod(staging, 0o755)
        target = self._dir("layers") / key
        if target.exists():
            self._remove(target)  # damaged (lookup said so under the build lock)
        staging.rename(target)
        self._evict(keep=key)
        info = (target / name).stat()
        self._verified.add((info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size))
        return StoredLayer(key, target / name, meta)

    def _evict(self, keep: str | None = None) -> None:
        layers = []
        for directory in (self.root / "layers").glob("*"):
            try:
                size = _layer_file(directory).stat().st_size
                layers.append((directory.stat().st_mtime, size, directory))
            except OSError:
                continue
        total = sum(size for _, size, _ in layers)
        now = time.time()
        for used, size, directory in sorted(layers):
            if total <= self.max_bytes:
                break
            if directory.name == keep or now - used < _EVICT_GRACE_SECONDS:
                continue
            log.info(
                "package layer cache over %d MB: removing %s", self.max_bytes >> 20, directory.name
            )
            self._remove(directory)
            total -= size

    def _remove(self, directory: Path) -> None:
        """Rename aside, then delete: a reader never sees half a directory."""
        trash = self.root / f".trash-{directory.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            directory.rename(trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def _layer_file(directory: Path) -> Path:
    archive = directory / ARCHIVE_FILE
    return archive if archive.exists() else directory / LAYER_FILE


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
