"""Installs into a running session's VM: `pip install` run by code in the VM (the reserved host
tool `_sbx_install`, sent by the guest's pip, exec_sandbox_guest/_install.py) and
Session.install() from the host. docs/packages.md, "Installs from inside".

The host resolves and builds exactly as for `packages=[...]` (packages/layers.py: same cache,
wheels only, no package code on the host, the host's own index configuration, which never
enters the VM), keeping the versions the VM already has (pip constraints), and writes the new
packages as one archive into the VM's home; the guest's pip unpacks it into the user site
directory on the work disk, so the packages travel with pause/resume and fork. What each
session installed is recorded here (and in a paused session's meta) so the host knows it.

What goes back to the VM is pip-shaped: its ERROR lines, with index URLs replaced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputValidationError, PackageBuildError, SandboxError, VmPermanentError
from .images.catalog import GuestImages
from .models import Language, PackagesReport
from .packages.layers import PackageLayers, normalize_name
from .packages.specs import MAX_PACKAGES, PackageSpec, validate_packages
from .packages.tools import ToolRefused, redact_urls
from .vm import file_transfer
from .vm.guest import GuestVm

log = logging.getLogger("exec_sandbox")

# Where, relative to the guest home, the archive lands (the guest's pip removes it).
ARCHIVE_DIR = ".cache/sbx-installs"
# Installs a session may try, failed ones included (each may resolve and download on the host):
# this many times its guest_installs_max.
ATTEMPTS_PER_INSTALL = 4
# Builds for guest installs at once on this host process (per event loop): a VM's code choosing
# packages must not take every core and the disk's bandwidth from the caller's own work.
GUEST_BUILDS_AT_ONCE = 2
_guest_builds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class RuntimeLayer:
    """One install into a running VM: the archive's key and what it added."""

    key: str
    kind: str
    # python: what this install added ("name==version"); javascript: the whole tree it put in
    # place of the previous one ("name@version").
    packages: tuple[str, ...]
    size: int
    requested: tuple[str, ...] = ()  # javascript: the tree's top-level packages, pinned

    def to_meta(self) -> dict[str, object]:
        return {
            "key": self.key,
            "kind": self.kind,
            "packages": list(self.packages),
            "size": self.size,
            "requested": list(self.requested),
        }

    @classmethod
    def from_meta(cls, value: object) -> RuntimeLayer:
        """From a paused session's meta; ValueError when it is not one."""
        if not isinstance(value, dict):
            raise ValueError("an installed layer must be an object")
        key, kind, packages, size = (value.get(k) for k in ("key", "kind", "packages", "size"))
        requested = value.get("requested", [])
        sep = "==" if kind == "python" else "@"
        if (
            not isinstance(key, str)
            or kind not in ("python", "javascript")
            or not isinstance(packages, list)
            or not all(isinstance(p, str) and sep in p[1:] for p in packages)
            or not isinstance(requested, list)
            or not all(isinstance(p, str) for p in requested)
            or not isinstance(size, int)
            or isinstance(size, bool)
        ):
            raise ValueError(f"an installed layer is malformed: {str(value)[:200]}")
        return cls(key, str(kind), tuple(packages), size, tuple(requested))


@dataclass(frozen=True)
class InstallLimits:
    enabled: bool
    max_installs: int
    max_bytes: int
    strict: bool  # enable_package_validation: exact pins or bare names only


class InstallRefused(SandboxError):
    """An install the sandbox or pip refused; `lines` are what the guest's pip prints."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class InstallService:
    """The installs of one session's VM (one at a time)."""

    def __init__(
        self,
        layers: PackageLayers,
        images: GuestImages,
        limits: InstallLimits,
        *,
        boot: PackagesReport | None,
        boot_kind: Language,
        runtime: Iterable[RuntimeLayer] = (),
    ) -> None:
        self._layers = layers
        self._images = images
        self._limits = limits
        self._boot = boot
        self._boot_kind = boot_kind
        self.runtime: list[RuntimeLayer] = list(runtime)
        self._lock = asyncio.Lock()
        self._attempts = 0  # installs that reached the host's resolver, failed ones too
        # Whether the last install came from the cache alone (Session.install()'s report).
        self.last_cache_hit = True

    @property
    def strict(self) -> bool:
        return self._limits.strict

    def installed(self, kind: str = "python") -> dict[str, str]:
        """normalized name -> version: the session's packages= layer and what was installed."""
        found: dict[str, str] = {}
        texts: list[str] = []
        if self._boot is not None and self._boot_kind == kind:
            texts += self._boot.packages
        for layer in self.runtime:
            if layer.kind == kind:
                texts += layer.packages
        for text in texts:
            name, sep, version = text.partition("==")
            if sep:
                found[normalize_name(name)] = version
        return found

    @property
    def packages(self) -> tuple[str, ...]:
        """What installs added: python's "name==version" in order, then the javascript tree's
        "name@version"."""
        python = [p for layer in self.runtime if layer.kind == "python" for p in layer.packages]
        tree = self._tree()
        return (*python, *(tree.packages if tree else ()))

    def _tree(self) -> RuntimeLayer | None:
        """The javascript tree in place now (each install replaces the previous one)."""
        trees = [layer for layer in self.runtime if layer.kind == "javascript"]
        return trees[-1] if trees else None

    def _used_bytes(self, replacing_tree: bool = False) -> int:
        tree = self._tree()
        used = sum(layer.size for layer in self.runtime if layer.kind == "python")
        return used + (tree.size if tree and not replacing_tree else 0)

    async def serve(self, vm: GuestVm, arguments: bytes) -> bytes:
        """The guest pip's call: JSON {"kwargs": {"kind", "requirements", "upgrade"}}. The
        answer is always a JSON object (TOOL_OK): {"installed", "satisfied", "archive"} or
        {"error": {"lines": [...]}}."""
        try:
            value = json.loads(arguments)
            kwargs = value.get("kwargs") if isinstance(value, dict) else None
            if not isinstance(kwargs, dict):
                raise ValueError("no keyword arguments")
            kind, texts = kwargs.get("kind"), kwargs.get("requirements")
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ValueError("requirements must be a list of strings")
            reply = await self.install(vm, kind, texts)
        except InstallRefused as exc:
            reply = {"error": {"lines": exc.lines}}
        except (ValueError, RecursionError) as exc:
            reply = {"error": {"lines": [f"ERROR: the install request is malformed: {exc}"[:300]]}}
        except Exception:
            # Whatever it was, the guest's pip gets an answer (it would wait for its exec's
            # timeout otherwise); the detail stays in the host's log.
            log.exception("an install into a running VM failed")
            reply = {"error": {"lines": ["ERROR: the install failed on the host (see its log)"]}}
        return json.dumps(reply).encode()

    async def install(self, vm: GuestVm, kind: object, texts: list[str]) -> dict[str, Any]:
        """Install texts into vm; raises InstallRefused with pip- or npm-style lines."""
        tool = "npm" if kind == "javascript" else "ERROR:"
        if not self._limits.enabled:
            raise InstallRefused(
                [
                    f"{tool} installs into a running sandbox are turned off on this host "
                    "(allow_guest_installs=False); create the session with packages=[...]"
                ]
            )
        if kind not in ("python", "javascript"):
            raise InstallRefused([f"ERROR: installs of {str(kind)[:40]!r} packages are not served"])
        if len(texts) > MAX_PACKAGES:
            raise InstallRefused([f"{tool} at most {MAX_PACKAGES} packages per install"])
        language: Language = "python" if kind == "python" else "javascript"
        try:
            specs = validate_packages(texts, language, strict=self._limits.strict, bare=True)
        except InputValidationError as exc:
            raise InstallRefused([f"{_prefix(language)} {exc}"]) from None
        async with self._lock:
            if len(self.runtime) >= self._limits.max_installs:
                raise InstallRefused(
                    [
                        f"{_prefix(language)} this sandbox has had its "
                        f"{self._limits.max_installs} installs (guest_installs_max); start a "
                        "session with packages=[...]"
                    ]
                )
            if self._attempts >= self._limits.max_installs * ATTEMPTS_PER_INSTALL:
                raise InstallRefused(
                    [
                        f"{_prefix(language)} this sandbox has tried "
                        f"{self._attempts} installs (guest_installs_max x "
                        f"{ATTEMPTS_PER_INSTALL}); start a session with packages=[...]"
                    ]
                )
            self._attempts += 1
            builds = _guest_builds.setdefault(
                asyncio.get_running_loop(), asyncio.Semaphore(GUEST_BUILDS_AT_ONCE)
            )
            try:
                async with builds:
                    if language == "python":
                        change = await self._python(specs)
                    else:
                        change = await self._javascript(specs)
            except ToolRefused as exc:
                lines = exc.lines or [f"{_prefix(language)} {_one_line(str(exc))}"]
                if language == "python":
                    lines += _python_hints(lines, specs, self.installed("python"))
                raise InstallRefused(lines) from None
            except InputValidationError as exc:
                raise InstallRefused([f"{_prefix(language)} {_one_line(str(exc))}"]) from None
            except (PackageBuildError, VmPermanentError) as exc:
                # Its text may name the host's paths and index: the guest gets a fixed line.
                log.warning("an install into a running VM failed to build: %s", exc)
                raise InstallRefused(
                    [f"{_prefix(language)} building the packages on the host failed (see its log)"]
                ) from None
            reply: dict[str, Any] = {
                "installed": [list(p) for p in change.added],
                "satisfied": [list(p) for p in change.satisfied],
                "archive": None,
            }
            self.last_cache_hit = change.cache_hit
            if change.layer is None or change.path is None:
                return reply
            used = self._used_bytes(replacing_tree=language == "javascript")
            if used + change.layer.size > self._limits.max_bytes:
                raise InstallRefused(
                    [
                        f"{_prefix(language)} installing {change.layer.size >> 20} MB more would "
                        f"pass this sandbox's {self._limits.max_bytes >> 20} MB for installs "
                        "(guest_installs_max_mb)"
                    ]
                )
            name = f"{ARCHIVE_DIR}/{change.layer.key}.tar"
            try:
                await file_transfer.write_file(vm, name.encode(), change.path, False)
            except (OSError, SandboxError) as exc:
                raise InstallRefused(
                    [
                        f"{_prefix(language)} Could not install packages due to an OSError: "
                        f"{_one_line(str(exc))}"
                    ]
                ) from None
            self.runtime.append(change.layer)
            log.info("installed into a running VM: %s", ", ".join(self.packages))
            reply["archive"] = name
            return reply

    async def _python(self, specs: tuple[PackageSpec, ...]) -> _Change:
        delta = await self._layers.get_delta(specs, self.installed("python"), self._images)
        if delta.key is None or delta.path is None:
            return _Change(None, None, (), delta.satisfied, True)
        layer = RuntimeLayer(
            key=delta.key,
            kind="python",
            packages=tuple(f"{n}=={v}" for n, v in delta.installed),
            size=delta.size,
        )
        cache_hit = delta.report is None or delta.report.cache_hit
        return _Change(layer, delta.path, delta.installed, delta.satisfied, cache_hit)

    async def _javascript(self, specs: tuple[PackageSpec, ...]) -> _Change:
        """npm re-hoists a tree on every install, so a javascript install builds the whole tree
        again (the earlier top-level packages pinned, the new ones on top) and the guest puts
        it in place of the previous one (~/node_modules)."""
        tree = self._tree()
        top = {_npm_name(text): text for text in (tree.requested if tree else ())}
        before = set(tree.packages) if tree else set()
        satisfied = [s for s in specs if s.name in top and s.requirement in (s.name, top[s.name])]
        merged = {name: PackageSpec(name, text) for name, text in top.items()}
        merged.update((s.name, s) for s in specs if s not in satisfied)
        if len(satisfied) == len(specs):
            pairs = tuple(_npm_pair(top[s.name]) for s in satisfied)
            return _Change(None, None, (), pairs, True)
        layer = await self._layers.get(
            "javascript", tuple(sorted(merged.values())), self._images, packed=True
        )
        assert layer is not None  # specs is not empty
        everything = layer.report.packages
        pinned = []
        for name in sorted(merged):
            versions = [p for p in everything if _npm_name(p) == name]
            pinned.append(versions[0] if len(versions) == 1 else merged[name].requirement)
        runtime = RuntimeLayer(
            key=layer.key,
            kind="javascript",
            packages=tuple(everything),
            size=layer.report.size_bytes,
            requested=tuple(pinned),
        )
        added = tuple(_npm_pair(p) for p in everything if p not in before)
        pairs = tuple(_npm_pair(top[s.name]) for s in satisfied)
        return _Change(runtime, layer.path, added, pairs, layer.report.cache_hit)


@dataclass(frozen=True)
class _Change:
    """What one install puts into the VM (layer None: nothing, all satisfied)."""

    layer: RuntimeLayer | None
    path: Path | None
    added: tuple[tuple[str, str], ...]
    satisfied: tuple[tuple[str, str], ...]
    cache_hit: bool


def _python_hints(
    lines: list[str], specs: tuple[PackageSpec, ...], installed: dict[str, str]
) -> list[str]:
    """What pip's own lines do not say about the sandbox's rules."""
    hints = []
    for spec in specs:
        version = installed.get(spec.name)
        versioned = any(c in spec.requirement for c in "=<>!~")
        if version is not None and versioned and not spec.requirement.endswith(f"=={version}"):
            hints.append(
                f"ERROR: {spec.name} {version} is installed in this sandbox, and a running "
                "sandbox never changes an installed version: start a session with "
                "packages=[...] for another one"
            )
    if any("No matching distribution" in line for line in lines):
        hints.append(
            "ERROR: (the sandbox installs wheels only: a package published as source only, or "
            "without a wheel for the sandbox, cannot be installed)"
        )
    return hints


def _prefix(language: Language) -> str:
    return "ERROR:" if language == "python" else "npm error"


def _npm_name(text: str) -> str:
    """The name of "name@version" or of a bare name (scoped names start with "@")."""
    at = text.find("@", 1)
    return text if at < 0 else text[:at]


def _npm_pair(text: str) -> tuple[str, str]:
    name = _npm_name(text)
    return name, text[len(name) + 1 :]


def runtime_from_meta(values: object) -> tuple[RuntimeLayer, ...]:
    """The installs a paused session's meta records (its `session.installed`)."""
    if values is None:
        return ()
    if not isinstance(values, list):
        raise ValueError("installed must be a list")
    return tuple(RuntimeLayer.from_meta(v) for v in values)


def runtime_to_meta(layers: Iterable[RuntimeLayer]) -> list[dict[str, object]]:
    return [layer.to_meta() for layer in layers]


def _one_line(text: str) -> str:
    """A message for the VM: one line, no index URL (they may hold the host's credentials)."""
    return redact_urls(" ".join(text.split()))[:2000]
