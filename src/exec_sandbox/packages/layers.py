"""Getting the package layer for a call: from the cache, or built once (per key, across tasks
and processes) and cached.

    request --(requests/ index, else the resolver)--> lock --(layer key)--> layers/ or a build

The request key covers the requirement texts, the language, the guest's interpreter and C
library versions and the format; the layer key covers the lock (names, versions, wheel hashes or
npm integrity hashes), the guest image's package tree, the same target and the format. A
request seen before therefore neither resolves nor downloads. A request with version ranges
(`enable_package_validation=False`) keeps the resolution it first got until its entry is evicted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..digest import file_sha256
from ..images.catalog import GuestImages
from ..models import Language, PackagesReport
from . import archive, erofs, npm_layer, pip_layer
from .layer import PackageLayer
from .specs import PackageSpec
from .store import LayerStore, StoredLayer
from .target import GuestTarget

log = logging.getLogger("exec_sandbox")

# Part of every key: a change in how layers are built or laid out must not reuse old ones.
LAYER_FORMAT = 1

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Delta:
    """What an install into a running VM adds: the packages new to it (with the archive that
    holds them, None when there are none) and the requested ones it already has."""

    key: str | None
    path: Path | None
    installed: tuple[tuple[str, str], ...]  # (name, version), new to the VM
    satisfied: tuple[tuple[str, str], ...]  # requested, already there
    size: int
    report: PackagesReport | None


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class PackageLayers:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.store = LayerStore(root, max_bytes)
        self._builds: dict[str, asyncio.Task[StoredLayer]] = {}
        # Observable counts for tests and benchmarks: what this process actually ran.
        self.resolves = 0
        self.builds = 0

    async def close(self) -> None:
        """Stop builds in progress (their tools are killed, their build directories removed)."""
        tasks = list(self._builds.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:
                pass

    async def get(
        self,
        language: Language,
        specs: tuple[PackageSpec, ...],
        images: GuestImages,
        progress: Progress | None = None,
        *,
        packed: bool = False,
    ) -> PackageLayer | None:
        """The layer holding specs for language (None for no packages). Raises
        PackageNotAllowedError for packages that cannot be installed, PackageBuildError when
        the index or a build step fails, VmPermanentError when a host tool is missing.
        packed: as a tar archive for a running VM (archive.py), not an EROFS image."""
        if not specs:
            return None
        target = GuestTarget.of(images)
        say = progress or (lambda _message: None)
        phases: dict[str, int] = {}
        request_key = _digest(
            {
                "format": LAYER_FORMAT,
                "language": language,
                "requirements": [s.requirement for s in specs],
                "python": target.python,
                "glibc": target.glibc,
            }
        )
        lock = await self.store.read_request(request_key)
        if lock is not None and not _usable_lock(lock, language):
            lock = None  # an entry of another version, or damaged: resolve again
        resolved = lock is None
        if lock is None:
            say(f"resolving {len(specs)} package{'s' if len(specs) > 1 else ''}")
            at = time.monotonic()
            lock = await self._resolve(language, specs, target)
            phases["resolve"] = _ms_since(at)
            await self.store.write_request(request_key, lock)
        layer_key = (
            ("install-" if packed else "")
            + f"{language}-"
            + _digest(
                {
                    "format": LAYER_FORMAT,
                    "language": language,
                    **({"archive": True} if packed else {}),
                    "identity": lock["identity"],
                    "tree": target.tree,
                    "python": target.python,
                    "glibc": target.glibc,
                }
            )[:24]
        )
        stored = await self._stored_or_built(
            layer_key,
            lambda: self._build(language, layer_key, lock, target, say, phases, packed=packed),
            phases,
        )
        report = PackagesReport(
            packages=tuple(lock["packages"]),
            cache_hit=not phases,
            resolved=resolved,
            build_ms=dict(phases),
            size_bytes=stored.size,
        )
        return PackageLayer(key=layer_key, path=stored.path, kind=language, report=report)

    async def get_delta(
        self,
        specs: tuple[PackageSpec, ...],
        installed: Mapping[str, str],
        images: GuestImages,
        progress: Progress | None = None,
    ) -> Delta:
        """Python packages for a running VM that has `installed` (normalized name -> version):
        resolved with those versions kept (pip constraints), minus what is there, packed as an
        archive (archive.py). The archive's key is the added packages' lock alone, so one cached
        archive serves every VM that lacks the same packages. Raises as get()."""
        target = GuestTarget.of(images)
        say = progress or (lambda _message: None)
        phases: dict[str, int] = {}
        pins = sorted(f"{name}=={version}" for name, version in installed.items())
        request_key = _digest(
            {
                "format": LAYER_FORMAT,
                "delta": pins,
                "requirements": [s.requirement for s in specs],
                "python": target.python,
                "glibc": target.glibc,
            }
        )
        lock = await self.store.read_request(request_key)
        if lock is not None and not (_usable_lock(lock, "python") and "satisfied" in lock):
            lock = None
        resolved = lock is None
        if lock is None:
            at = time.monotonic()
            self.resolves += 1
            async with self.store.build_dir() as work:
                wheels = await pip_layer.resolve(specs, target, work, tuple(pins))
            new = [w for w in wheels if installed.get(normalize_name(w.name)) != w.version]
            requested = {s.name for s in specs}
            lock = {
                "packages": [f"{w.name}=={w.version}" for w in new],
                "identity": [[w.name, w.version, w.sha256] for w in new],
                "wheels": [[w.name, w.version, _redact(w.url), w.sha256] for w in new],
                "satisfied": [
                    [w.name, w.version]
                    for w in wheels
                    if w not in new and normalize_name(w.name) in requested
                ],
            }
            phases["resolve"] = _ms_since(at)
            await self.store.write_request(request_key, lock)
        satisfied = tuple((str(n), str(v)) for n, v in lock["satisfied"])
        added = tuple((str(n), str(v)) for n, v, _ in lock["identity"])
        if not added:
            return Delta(None, None, (), satisfied, 0, None)
        layer_key = (
            "install-python-"
            + _digest(
                {
                    "format": LAYER_FORMAT,
                    "archive": True,
                    "identity": lock["identity"],
                    "python": target.python,
                    "glibc": target.glibc,
                }
            )[:24]
        )
        stored = await self._stored_or_built(
            layer_key,
            lambda: self._build("python", layer_key, lock, target, say, phases, packed=True),
            phases,
        )
        report = PackagesReport(
            packages=tuple(lock["packages"]),
            cache_hit=not phases,
            resolved=resolved,
            build_ms=dict(phases),
            size_bytes=stored.size,
        )
        return Delta(layer_key, stored.path, added, satisfied, stored.size, report)

    async def _stored_or_built(
        self,
        layer_key: str,
        build: Callable[[], Coroutine[Any, Any, StoredLayer]],
        phases: dict[str, int],
    ) -> StoredLayer:
        """The cache's layer (or archive) of that key, checked; else the one being built by
        another call of this process (its wait recorded in phases); else build() now, once,
        shielded (a cancelled caller leaves the build to finish for the next one)."""
        stored = await self.store.lookup(layer_key)
        if stored is not None and await self.store.verify(stored):
            return stored
        task = self._builds.get(layer_key)
        if task is not None:  # another call of this process is building it: wait for that
            at = time.monotonic()
            stored = await asyncio.shield(task)
            phases["wait"] = _ms_since(at)
            return stored
        task = asyncio.create_task(build(), name=f"package-layer-{layer_key}")
        self._builds[layer_key] = task
        task.add_done_callback(lambda _t: self._builds.pop(layer_key, None))
        return await asyncio.shield(task)

    async def _resolve(
        self, language: Language, specs: tuple[PackageSpec, ...], target: GuestTarget
    ) -> dict[str, Any]:
        self.resolves += 1
        async with self.store.build_dir() as work:
            if language == "python":
                wheels = await pip_layer.resolve(specs, target, work)
                return {
                    "packages": [f"{w.name}=={w.version}" for w in wheels],
                    "identity": [[w.name, w.version, w.sha256] for w in wheels],
                    "wheels": [[w.name, w.version, _redact(w.url), w.sha256] for w in wheels],
                }
            resolution = await npm_layer.resolve(specs, work)
            locked = npm_layer.locked_packages(resolution)
            return {
                "packages": [f"{name}@{version}" for name, version, _ in locked],
                "identity": [list(entry) for entry in locked],
                "npm": resolution,
            }

    async def _build(
        self,
        language: Language,
        key: str,
        lock: dict[str, Any],
        target: GuestTarget,
        say: Progress,
        phases: dict[str, int],
        packed: bool = False,
    ) -> StoredLayer:
        """packed: a tar archive (archive.py) instead of an EROFS image."""
        at = time.monotonic()
        async with self.store.build_lock(key):
            # Another process may have built it while this one waited for the lock.
            stored = await self.store.lookup(key)
            if stored is not None and await self.store.verify(stored):
                phases["wait"] = _ms_since(at)
                return stored
            self.builds += 1
            count = len(lock["packages"])
            async with self.store.build_dir() as work:
                tree = work / "tree"
                at = time.monotonic()
                if language == "python":
                    wheels = [pip_layer.LockedWheel(*entry) for entry in lock["wheels"]]
                    say(f"downloading {count} wheels")
                    size = await pip_layer.download(wheels, target, work / "wheels")
                    phases["download"] = _ms_since(at)
                    say(f"unpacking {count} wheels ({size / 1e6:.1f} MB)")
                    at = time.monotonic()
                    await pip_layer.unpack(work / "wheels", target, tree)
                    phases["unpack"] = _ms_since(at)
                    say("compiling bytecode")
                    at = time.monotonic()
                    await pip_layer.compile_bytecode(tree, target)
                    phases["compile"] = _ms_since(at)
                else:
                    say(f"downloading {count} npm packages")
                    tree = await npm_layer.download(lock["npm"], work)
                    phases["download"] = _ms_since(at)
                say("packing the layer image")
                at = time.monotonic()
                image = work / ("layer.tar" if packed else "layer.erofs")
                size = await (
                    archive.pack(tree, image, javascript=language == "javascript")
                    if packed
                    else erofs.pack(tree, image)
                )
                digest = await asyncio.get_running_loop().run_in_executor(None, file_sha256, image)
                phases["image"] = _ms_since(at)
                meta = {
                    "format": LAYER_FORMAT,
                    "language": language,
                    "size": size,
                    "sha256": digest,
                    "packages": lock["packages"],
                    "built_ms": dict(phases),
                    "created": time.time(),
                }
                stored = await self.store.publish(key, image, meta)
            log.info(
                "package layer %s built: %d packages, %.1f MB, %s",
                key,
                count,
                size / 1e6,
                ", ".join(f"{k} {v} ms" for k, v in phases.items()),
            )
            return stored


def _usable_lock(lock: dict[str, Any], language: Language) -> bool:
    details = lock.get("wheels") if language == "python" else lock.get("npm")
    return (
        isinstance(lock.get("packages"), list)
        and isinstance(lock.get("identity"), list)
        and (isinstance(details, list) if language == "python" else isinstance(details, dict))
    )


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _ms_since(at: float) -> int:
    return int(round((time.monotonic() - at) * 1000))


def _redact(url: str) -> str:
    """A URL without user and password: pip applies the configured credentials of the index
    again when it downloads, and the cache holds no secret."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
