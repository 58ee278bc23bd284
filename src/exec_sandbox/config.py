"""SchedulerConfig: validated settings of a Scheduler."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import paths
from .errors import InputValidationError, PackageNotAllowedError, VmConfigError
from .limits import (
    ADMISSION_TIMEOUT_SECONDS,
    DEFAULT_DISK_MB,
    MAX_DISK_MB,
    MAX_TIMEOUT_SECONDS,
    MIN_DISK_MB,
    MIN_MEMORY_MB,
    MIN_TIMEOUT_SECONDS,
)
from .models import LANGUAGES
from .packages.specs import validate_packages
from .validation import validate_template_name


def _host_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def derive_max_concurrent_vms(memory_mb: int, memory_ratio: float, cpu_ratio: float) -> int:
    """VMs this host can hold at once: the smaller of the CPU budget (cores x ratio) and the
    memory budget (host RAM x ratio / guest RAM, guests rarely touch all their RAM), at least 1."""
    cpus = os.cpu_count() or 1
    by_cpu = int(cpus * cpu_ratio)
    by_memory = int(_host_memory_mb() * memory_ratio / max(memory_mb, 1))
    return max(1, min(by_cpu, by_memory))


@dataclass
class SchedulerConfig:
    """Settings of a Scheduler. Every field is checked on construction: a bad value raises
    VmConfigError before anything starts."""

    # Idle VMs kept ready: one count for every language of the default image, or a mapping
    # such as {"python": 2, "go-dev:raw": 1} whose keys are a language (the default image) or
    # "TEMPLATE:LANGUAGE" (a template's VMs; docs/templates.md); what is left out gets none. Cut,
    # with a warning, to what admission admits at once (pool.py).
    warm_pool_size: int | Mapping[str, int] = 0
    default_memory_mb: int = 192
    # Each VM's work disk (/home/user and /tmp; docs/design.md "Workspace"): sparse on the host,
    # so its size costs nothing until the guest writes. Per call: disk_mb.
    default_disk_mb: int = DEFAULT_DISK_MB
    default_timeout_seconds: int = 30
    session_idle_timeout_seconds: int = 300
    max_concurrent_vms: int | None = None
    images_dir: Path = field(default_factory=paths.images_dir)
    memory_snapshot_cache_dir: Path = field(
        default_factory=lambda: paths.cache_dir() / "memory-snapshots"
    )
    # The package layer cache (packages/store.py).
    package_cache_dir: Path = field(default_factory=lambda: paths.cache_dir() / "packages")
    memory_overcommit_ratio: float = 5.0
    cpu_overcommit_ratio: float = 2.0
    enable_package_validation: bool = True
    # Beyond the public contract: speed tiers and admission control.
    memory_snapshots: bool = True  # L1: restore fresh VMs from memory snapshots
    admission_queue_size: int | None = None  # requests that may wait; None: 4 x max VMs
    admission_timeout_seconds: float = ADMISSION_TIMEOUT_SECONDS
    # Packages every VM of a language gets (pooled and snapshotted like plain VMs), e.g.
    # {"python": ["numpy==2.1.3", "pandas==2.2.3"]}; a call's `packages` are added on top.
    default_packages: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Size cap of the package layer cache (least recently used layers go first).
    package_cache_max_mb: int = 10 * 1024
    # `pip install` inside a session (and Session.install()): code in the VM picks packages
    # that the host fetches with its own index configuration and credentials (docs/security.md);
    # False refuses them. Per session at most this many installs and this much installed.
    allow_guest_installs: bool = True
    guest_installs_max: int = 16
    guest_installs_max_mb: int = 2048
    # Templates (templates/, docs/templates.md): the cache, its size cap (least recently used
    # first), the largest one template may be (also the builder's output disk, sparse), and the
    # builder VM's RAM (its tmpfs holds the unpacked tree while it is built).
    template_cache_dir: Path = field(default_factory=lambda: paths.cache_dir() / "templates")
    # Volumes (volumes/, docs/design.md "Volumes"): user data, so under the data directory, not
    # the cache.
    volume_dir: Path = field(default_factory=lambda: paths.data_dir() / "volumes")
    template_cache_max_mb: int = 20 * 1024
    template_max_mb: int = 4 * 1024
    template_build_memory_mb: int = 3 * 1024
    # What an idle session becomes after session_idle_timeout_seconds: "close" (its state is
    # lost) or "pause" (saved to disk; Scheduler.snapshots() lists it, resume() brings it back).
    session_idle_action: str = "close"
    # Paused sessions (Session.pause()): kept this long since last used, and under this size.
    session_snapshot_ttl_seconds: int = 7 * 24 * 3600
    session_snapshot_max_mb: int = 20 * 1024
    # Network. An operator's choice, never a per-call one: let streams reach private
    # ranges (RFC 1918, CGNAT, IPv6 ULA); loopback, link-local and this host stay denied.
    network_allow_private_ranges: bool = False
    # The CA bundle (PEM) the guest trusts for TLS; None: the host's system bundle (so that a
    # TLS-intercepting proxy the host trusts works in the guest too).
    network_ca_bundle: Path | None = None
    # TESTS ONLY: {"name" or "name:port": "address" or "address:port"} replaces the host's
    # resolver for exactly these names and lets their streams reach that address even on the
    # deny list (the tests' servers on 127.0.0.1). Every other name keeps the default policy,
    # and these names must still be in allowed_domains.
    network_test_hosts: Mapping[str, str] = field(default_factory=dict)
    # Deprecated name (it never held disk snapshots): a directory given here puts the package
    # layer cache in its "packages" subdirectory, where that name kept it.
    disk_snapshot_cache_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.disk_snapshot_cache_dir is not None:
            warnings.warn(
                "SchedulerConfig.disk_snapshot_cache_dir is deprecated: set "
                "package_cache_dir (its 'packages' subdirectory is the same cache)",
                DeprecationWarning,
                stacklevel=3,
            )
            if not isinstance(self.disk_snapshot_cache_dir, (str, os.PathLike)):
                raise VmConfigError(
                    f"disk_snapshot_cache_dir must be a path, got {self.disk_snapshot_cache_dir!r}"
                )
            self.disk_snapshot_cache_dir = Path(self.disk_snapshot_cache_dir)
            self.package_cache_dir = self.disk_snapshot_cache_dir / "packages"
        self.warm_pool_size = _check_pool_size(self.warm_pool_size)
        _check_int("default_memory_mb", self.default_memory_mb, MIN_MEMORY_MB, 64 * 1024)
        _check_int(
            "default_timeout_seconds",
            self.default_timeout_seconds,
            MIN_TIMEOUT_SECONDS,
            MAX_TIMEOUT_SECONDS,
        )
        _check_int("session_idle_timeout_seconds", self.session_idle_timeout_seconds, 10, 3600)
        for name in ("memory_overcommit_ratio", "cpu_overcommit_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise VmConfigError(f"{name} must be a positive number, got {value!r}")
        if self.max_concurrent_vms is None:
            self.max_concurrent_vms = derive_max_concurrent_vms(
                self.default_memory_mb, self.memory_overcommit_ratio, self.cpu_overcommit_ratio
            )
        _check_int("max_concurrent_vms", self.max_concurrent_vms, 1, 4096)
        for name in (
            "images_dir",
            "memory_snapshot_cache_dir",
            "package_cache_dir",
            "template_cache_dir",
        ):
            value = getattr(self, name)
            if not isinstance(value, (str, os.PathLike)):
                raise VmConfigError(f"{name} must be a path, got {value!r}")
            setattr(self, name, Path(value))
        for name in (
            "enable_package_validation",
            "allow_guest_installs",
            "memory_snapshots",
            "network_allow_private_ranges",
        ):
            if not isinstance(getattr(self, name), bool):
                raise VmConfigError(f"{name} must be a bool")
        if self.admission_queue_size is not None:
            _check_int("admission_queue_size", self.admission_queue_size, 0, 1_000_000)
        _check_int("package_cache_max_mb", self.package_cache_max_mb, 64, 1 << 30)
        _check_int("guest_installs_max", self.guest_installs_max, 0, 1024)
        _check_int("guest_installs_max_mb", self.guest_installs_max_mb, 1, 1 << 20)
        _check_int("template_cache_max_mb", self.template_cache_max_mb, 64, 1 << 30)
        _check_int("template_max_mb", self.template_max_mb, 16, 1 << 20)
        _check_int("default_disk_mb", self.default_disk_mb, MIN_DISK_MB, MAX_DISK_MB)
        _check_int("template_build_memory_mb", self.template_build_memory_mb, 256, 64 * 1024)
        if self.session_idle_action not in ("close", "pause"):
            raise VmConfigError(
                f"session_idle_action must be 'close' or 'pause', got {self.session_idle_action!r}"
            )
        _check_int("session_snapshot_ttl_seconds", self.session_snapshot_ttl_seconds, 60, 1 << 30)
        _check_int("session_snapshot_max_mb", self.session_snapshot_max_mb, 256, 1 << 30)
        self.default_packages = _check_default_packages(
            self.default_packages, self.enable_package_validation
        )
        if self.network_ca_bundle is not None:
            if not isinstance(self.network_ca_bundle, (str, os.PathLike)):
                raise VmConfigError(
                    f"network_ca_bundle must be a path, got {self.network_ca_bundle!r}"
                )
            self.network_ca_bundle = Path(self.network_ca_bundle)
        if not isinstance(self.network_test_hosts, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.network_test_hosts.items()
        ):
            raise VmConfigError("network_test_hosts must map names to addresses (str -> str)")
        value = self.admission_timeout_seconds
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
            raise VmConfigError(
                f"admission_timeout_seconds must be a number in (0, 3600], got {value!r}"
            )


def _check_default_packages(value: object, strict: bool) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise VmConfigError(
            f"default_packages must be a mapping of language to packages, got {value!r}"
        )
    out: dict[str, tuple[str, ...]] = {}
    for language, packages in value.items():
        if language not in ("python", "javascript"):
            raise VmConfigError(
                f"default_packages: packages are for 'python' and 'javascript', not {language!r}"
            )
        try:
            validate_packages(packages, language, strict=strict)
        except PackageNotAllowedError as exc:
            raise VmConfigError(f"default_packages[{language!r}]: {exc}") from None
        out[language] = tuple(packages)
    return out


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise VmConfigError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise VmConfigError(f"{name} must be between {low} and {high}, got {value}")


def _check_pool_size(value: object) -> int | dict[str, int]:
    """An int, or a mapping of "LANGUAGE" or "TEMPLATE:LANGUAGE" keys to ints (copied: later
    changes to the caller's dict do not reach the scheduler)."""
    if not isinstance(value, Mapping):
        _check_int("warm_pool_size", value, 0, 64)
        assert isinstance(value, int)
        return value
    sizes: dict[str, int] = {}
    for key, count in value.items():
        if not isinstance(key, str):
            raise VmConfigError(f"warm_pool_size: keys are strings, got {key!r}")
        # Template names have no ':' (validate_template_name), so the last one splits.
        template, colon, lang = key.rpartition(":")
        if colon:
            try:
                validate_template_name(template)
            except InputValidationError as exc:
                raise VmConfigError(f"warm_pool_size[{key!r}]: {exc}") from None
        if lang not in LANGUAGES:
            raise VmConfigError(
                f"warm_pool_size: unknown language {lang!r} in {key!r} (keys are LANGUAGE or "
                f"TEMPLATE:LANGUAGE, the language one of {', '.join(LANGUAGES)})"
            )
        _check_int(f"warm_pool_size[{key!r}]", count, 0, 64)
        sizes[key] = count
    return sizes
