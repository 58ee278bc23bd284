"""Provisioning: where a scheduler's fresh VMs come from, and the fallback policy between paths.

A VM of a configuration is a clone of its L1 memory snapshot when one is cached (`snapshots/l1.py`),
else a cold boot, which also schedules the snapshot's build in the background. The fallbacks:
- a snapshot damaged since it was built (`SnapshotIntegrityError`): cold boot, the snapshot is
  discarded and rebuilt once; damaged again, this scheduler gives up on it;
- a restore that fails otherwise (QEMU refuses the stream, the clone does not come up): cold
  boot, the snapshot is discarded and not rebuilt automatically (it would fail again);
- a cold boot that fails: its error goes to the caller (VmTransientError: the code never ran).

The warm pool (`pool.py`) gets its VMs from here too (`start_pool_vm`: start, then warm up; of
the default image or of a template, at the pool's RAM and vCPUs), so the pool depends on this
module, never on the scheduler. Background work (pool refills, snapshot builds) waits for
`Foreground.wait_quiet()`: on a 2-core host a background boot next to a request makes the
request slower.

The VMs themselves come from a `VmFactory`: QEMU (`QemuVms`) in production; unit tests pass a
factory of guest stand-ins (tests/unit/guest_stand_in.py) so that the orchestration's failure
branches run in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .. import limits
from ..config import SchedulerConfig
from ..errors import SandboxError
from ..images.catalog import GuestImages, load_images
from ..models import Language, Template
from ..packages.layer import PackageLayer
from ..packages.layers import PackageLayers
from ..packages.specs import PackageSpec, merge_packages, validate_packages
from ..snapshots import node_startup
from ..snapshots.identity import machine_identity, qemu_version
from ..snapshots.l1 import Snapshot, SnapshotCache, snapshot_key, template_holds_interpreter
from ..snapshots.node_startup import NodeStartupCache, blob_key
from ..snapshots.ram import SnapshotIntegrityError
from ..templates.store import TemplateStore
from ..vm import host_facts, migration
from ..vm.execution import OutputCallback
from ..vm.guest import GuestVm
from ..vm.jail import jail_options, prepare_host
from ..vm.qmp import QmpError
from ..vm.registry import VmRegistry
from ..vm.spec import TemplateDisk, VmSpec
from ..volumes import VolumeClaims, kernel_cmdline
from .admission import Admission

if TYPE_CHECKING:  # the pool depends on this module, not the other way round
    from .pool import PoolShape

log = logging.getLogger("exec_sandbox")

_QUIET_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class HostSetup:
    """What VMs of this host are started with (found once, at the scheduler's start)."""

    images: GuestImages
    qemu_binary: str
    accel: str
    kernel_cmdline_extra: str


class VmFactory(Protocol):
    """Where VMs come from: QEMU (`QemuVms`), or guest stand-ins in unit tests. Each VM is
    registered with `registry` from its spawn on: the owner's close() kills booting ones too."""

    async def host_setup(self, config: SchedulerConfig) -> HostSetup: ...

    async def boot(
        self,
        spec: VmSpec,
        *,
        registry: VmRegistry,
        boot_timeout: float,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm: ...

    async def restore(
        self,
        spec: VmSpec,
        state_path: str,
        *,
        registry: VmRegistry,
        timeout: float,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm: ...


class QemuVms:
    """The production VmFactory: QEMU microVMs."""

    async def host_setup(self, config: SchedulerConfig) -> HostSetup:
        """Find the images, QEMU, the accelerator and the TSC frequency; VmPermanentError if
        one is missing. The KVM probe starts QEMU once and the TSC measurement sleeps: both
        run off the loop."""
        images = load_images(config.images_dir)
        loop = asyncio.get_running_loop()
        qemu = await loop.run_in_executor(None, host_facts.qemu_binary)
        accel = await loop.run_in_executor(None, host_facts.accelerator)
        # QEMU's root (ldd) and seccomp policy (its version): programs run once, not on the loop.
        await loop.run_in_executor(None, prepare_host, qemu)
        khz = await loop.run_in_executor(None, host_facts.tsc_khz)
        if config.memory_snapshots:
            await loop.run_in_executor(None, qemu_version, qemu)
        return HostSetup(images, qemu, accel, f"tsc_early_khz={khz}" if khz > 0 else "")

    async def boot(
        self,
        spec: VmSpec,
        *,
        registry: VmRegistry,
        boot_timeout: float,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm:
        return await GuestVm.boot(
            spec, registry=registry, boot_timeout=boot_timeout, on_boot_log=on_boot_log
        )

    async def restore(
        self,
        spec: VmSpec,
        state_path: str,
        *,
        registry: VmRegistry,
        timeout: float,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm:
        return await migration.restore(
            spec, state_path, registry=registry, timeout=timeout, on_boot_log=on_boot_log
        )


@dataclass
class Phases:
    """What getting one VM went through (filled in as it goes; ExecutionResult.timing)."""

    admission_ms: int = 0
    boot_ms: int = 0
    restore_ms: int = 0
    connect_ms: int = 0
    pool_hit: bool = False
    l1_hit: bool = False


class Foreground:
    """Requests in progress (run(), opening a session): background work waits until none is."""

    def __init__(self) -> None:
        self.active = 0

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1

    async def wait_quiet(self) -> None:
        while self.active > 0:
            await asyncio.sleep(_QUIET_POLL_SECONDS)


class Provisioner:
    """Starts one scheduler's VMs (see the module docstring). Owns the L1 snapshot cache and its
    builds, and the package layers' cache; the VMs it starts belong to its caller."""

    def __init__(
        self,
        config: SchedulerConfig,
        admission: Admission,
        registry: VmRegistry,
        foreground: Foreground,
        factory: VmFactory | None = None,
    ) -> None:
        self.config = config
        self.factory: VmFactory = factory if factory is not None else QemuVms()
        self._admission = admission
        self._registry = registry
        self.foreground = foreground
        self._host: HostSetup | None = None
        # Node's startup snapshot, which javascript templates leave there, is given to cold
        # boots too (node_startup.py), also with memory snapshots off.
        self.node_cache = NodeStartupCache(config.memory_snapshot_cache_dir)
        self.snapshots = (
            SnapshotCache(config.memory_snapshot_cache_dir, self.node_cache)
            if config.memory_snapshots
            else None
        )
        self._snapshot_builds: dict[str, asyncio.Task[Snapshot | None]] = {}
        self._snapshot_failed: set[str] = set()
        # Package layers (packages/): the cache, and each language's default set (config).
        self.layers = PackageLayers(config.package_cache_dir, config.package_cache_max_mb << 20)
        # Templates (templates/): their images, attached to the VMs that run them.
        self.templates = TemplateStore(
            config.template_cache_dir, max_bytes=config.template_cache_max_mb << 20
        )
        self._default_packages: dict[str, tuple[PackageSpec, ...]] = {
            lang: validate_packages(specs, lang, strict=config.enable_package_validation)  # type: ignore[arg-type]
            for lang, specs in config.default_packages.items()
        }
        # The layer identity of the pool's VMs per language (None: no default packages).
        self.pool_layers: dict[str, str | None] = {}

    async def start(self) -> None:
        if self._host is None:
            self._host = await self.factory.host_setup(self.config)

    @property
    def accel(self) -> str:
        return "" if self._host is None else self._host.accel

    @property
    def images(self) -> GuestImages | None:
        return None if self._host is None else self._host.images

    async def close(self) -> None:
        """Stop the package layers' work and cancel the snapshot builds in progress."""
        await self.layers.close()
        builds = list(self._snapshot_builds.values())
        for task in builds:
            task.cancel()
        for task in builds:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._snapshot_builds.clear()

    def close_snapshot_cache(self) -> None:
        """Last: the sealed RAM copies clones map (once no VM of the scheduler runs)."""
        if self.snapshots is not None:
            self.snapshots.close()

    # --- what a VM gets ---

    def packages_of(
        self, language: Language, requested: tuple[PackageSpec, ...]
    ) -> tuple[PackageSpec, ...]:
        """The packages a call's VM gets: the scheduler's default set of the language with the
        call's own (validated: RunRequest) on top."""
        return merge_packages(self._default_packages.get(language, ()), requested)

    async def layer_for(
        self, language: Language, specs: tuple[PackageSpec, ...], on_progress: OutputCallback | None
    ) -> PackageLayer | None:
        """The package layer of specs: cached, or built now (progress lines go to on_progress,
        the call's boot log)."""
        if not specs:
            return None
        assert self._host is not None

        def progress(message: str) -> None:
            log.info("packages: %s", message)
            if on_progress is not None:
                on_progress(f"[packages] {message}\n")

        return await self.layers.get(language, specs, self._host.images, progress)

    def spec(
        self,
        memory_mb: int,
        layer: PackageLayer | None = None,
        vcpus: int = limits.DEFAULT_VCPUS,
        template: TemplateDisk | None = None,
        disk_mb: int = 0,
    ) -> VmSpec:
        """A VM of this host; disk_mb: its work disk's size (0: none, as a template builder)."""
        assert self._host is not None
        return VmSpec(
            qemu_binary=self._host.qemu_binary,
            images=self._host.images,
            accel=self._host.accel,
            memory_mb=memory_mb,
            vcpus=vcpus,
            kernel_cmdline_extra=self._host.kernel_cmdline_extra,
            jail=jail_options(
                memory_mb, vcpus, qemu_binary=self._host.qemu_binary, accel=self._host.accel
            ),
            qemu_sandbox=True,
            layer=layer,
            template=template,
            # QMP on every VM: a session's VM can be paused or forked (snapshots/forks.py).
            qmp=True,
            disk_mb=disk_mb,
            disk_dir=self.disk_dir,
        )

    @property
    def disk_dir(self) -> Path:
        """Where work disks are made: on the snapshot cache's file system, so that a pause
        links a disk into its snapshot and copies can share extents (vm/workspace.py)."""
        return self.config.memory_snapshot_cache_dir / "disks"

    def pool_serves(self, language: Language, layer: PackageLayer | None) -> bool:
        """Whether the pool's VMs of language have this package layer (the default one)."""
        return self.pool_layers.get(language) == (None if layer is None else layer.identity)

    # --- starting VMs ---

    async def start_vm(
        self,
        language: Language,
        memory_mb: int,
        phases: Phases,
        layer: PackageLayer | None = None,
        *,
        on_boot_log: OutputCallback | None = None,
        net_port: bool = False,
        vcpus: int = limits.DEFAULT_VCPUS,
        template: TemplateDisk | None = None,
        disk_mb: int = 0,
        volumes: VolumeClaims | None = None,
    ) -> GuestVm:
        """Restore the configuration's L1 snapshot, or cold boot (scheduling the snapshot).
        volumes: always a cold boot, never a snapshot: a guest's state holds the volumes'
        file systems mounted, and a snapshot's clones would all write one disk.
        net_port: the VM gets the network port (its own snapshots: the device layout differs).
        disk_mb: its work disk (a copy of the snapshot's, or a new one the guest formats)."""
        spec = replace(self.spec(memory_mb, layer, vcpus, template, disk_mb), net_port=net_port)
        if volumes is not None and volumes.attaches:
            extra = f"{spec.kernel_cmdline_extra} {kernel_cmdline(volumes.attaches)}".strip()
            spec = replace(spec, volumes=volumes, kernel_cmdline_extra=extra)
        elif self.snapshots is not None:
            key = snapshot_key(spec, language)
            snapshot = self.snapshots.lookup(key, memory_mb)
            if snapshot is None:
                self.schedule_snapshot(spec, language, key)
            else:
                vm = await self._restore_or_none(spec, language, key, snapshot, phases, on_boot_log)
                if vm is not None:
                    return vm
        at = time.monotonic()
        vm = await self.factory.boot(
            spec,
            registry=self._registry,
            boot_timeout=limits.BOOT_TIMEOUT_SECONDS,
            on_boot_log=on_boot_log,
        )
        # The startup blob is of the default image's node: a template's node is its own.
        if language == "javascript" and node_startup.GIVE_TO_COLD_BOOTS and template is None:
            try:
                await self._give_node_startup(vm, spec)
            except BaseException:
                vm.close()
                raise
        phases.boot_ms = _ms(time.monotonic() - at)
        return vm

    async def boot(self, spec: VmSpec) -> GuestVm:
        """A cold boot of spec, registered like every VM, never from or into a snapshot (a
        template's builder VM)."""
        return await self.factory.boot(
            spec,
            registry=self._registry,
            boot_timeout=limits.BOOT_TIMEOUT_SECONDS,
            on_boot_log=None,
        )

    async def _give_node_startup(self, vm: GuestVm, spec: VmSpec) -> None:
        """A cold-booted VM's node starts from this machine's startup snapshot when the host
        has one (about 0.7 s less per node start under TCG); one the VM refuses is dropped.
        None for an image whose node has its own built-in snapshot (node_startup.wanted)."""
        if node_startup.wanted(spec):
            await self.node_cache.give(vm, blob_key(machine_identity(spec)))

    async def _restore_or_none(
        self,
        spec: VmSpec,
        language: Language,
        key: str,
        snapshot: Snapshot,
        phases: Phases,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm | None:
        """A clone of snapshot, or None after a failure that a cold boot gets round (the
        snapshot is then discarded; see the module docstring)."""
        assert self.snapshots is not None
        at = time.monotonic()
        try:
            # A sealed memfd copy of the RAM file, not the file (snapshots/ram.py RamFiles).
            ram_fd = await asyncio.get_running_loop().run_in_executor(
                None, self.snapshots.ram_fd, snapshot
            )
            # Its own copy of the snapshot's work disk (a fresh file system: small), which the
            # guest has mounted in the state it resumes from.
            disk = await self.snapshots.disk_copy(snapshot, spec)
            try:
                vm = await self.factory.restore(
                    replace(spec, mem_fd=ram_fd, mem_shared=False, work=disk),
                    str(snapshot.state),
                    registry=self._registry,
                    timeout=limits.RESTORE_TIMEOUT_SECONDS,
                    on_boot_log=on_boot_log,
                )
            except BaseException:
                if disk is not None:
                    disk.close()  # the VM's, if it started (closed with it): idempotent
                raise
        except SnapshotIntegrityError as exc:
            # Damaged since it was built (checked on the copy clones would map): a rebuild
            # fixes that, once; damaged again, this scheduler gives up on it.
            rebuild = self.snapshots.discard_corrupt(key)
            log.warning(
                "memory snapshot %s is corrupt (%s): cold boot instead; the snapshot "
                "is discarded%s",
                key,
                exc,
                " and rebuilt" if rebuild else "",
            )
            if rebuild:
                self.schedule_snapshot(spec, language, key)
            else:
                self._snapshot_failed.add(key)
            return None
        except (SandboxError, QmpError, OSError) as exc:
            if self._registry.closed:
                raise SandboxError("the scheduler was closed while the VM started") from exc
            log.warning(
                "restoring memory snapshot %s failed (%s): cold boot instead; the "
                "snapshot is discarded",
                key,
                exc,
            )
            self.snapshots.invalidate(key)
            # Not rebuilt automatically: a snapshot this QEMU cannot load would fail again
            # (prepare_snapshot() still rebuilds it on request).
            self._snapshot_failed.add(key)
            return None
        phases.restore_ms = _ms(vm.restore_seconds)
        phases.connect_ms = _ms(vm.connect_seconds)
        phases.l1_hit = True
        log.debug("restored %s in %.0f ms", key, (time.monotonic() - at) * 1000)
        return vm

    async def start_pool_vm(
        self, language: Language, shape: PoolShape | None = None
    ) -> tuple[GuestVm, bool]:
        """A VM for the warm pool, warmed up, with its interpreter pre-started; and whether it
        was restored from an L1 snapshot. shape (pool.py): its RAM, vCPUs and template; None:
        the default image at the scheduler's default RAM and vCPUs. The pool owns it
        (pool.VmFactory)."""
        phases = Phases()
        template = None if shape is None else shape.template
        layer = None
        disk = None
        if template is None:
            # The default image's pools hold VMs with the language's default packages.
            specs = self._default_packages.get(language, ())
            layer = await self.layer_for(language, specs, None)
            self.pool_layers[language] = None if layer is None else layer.identity
        else:
            # A template brings its own packages; its L1 snapshots key on its digest. Its image
            # is hashed before the first VM of this process gets it, as a call's is (resolve).
            disk = TemplateDisk(await self.templates.verified(template.digest), template.digest)
        memory = self.config.default_memory_mb if shape is None else shape.memory_mb
        vcpus = limits.DEFAULT_VCPUS if shape is None else shape.vcpus
        vm = await self.start_vm(
            language,
            memory,
            phases,
            layer,
            vcpus=vcpus,
            template=disk,
            disk_mb=self.config.default_disk_mb,
        )
        try:
            # The interpreter of the next run starts now, off the request path (after the RESEED
            # of a clone; never in a template: none is taken of this VM). The warm-up then runs
            # through it, along the very path a pool hit takes: cold-booted, that pages the
            # interpreter in; in any VM, it has this QEMU process translate the agent's and the
            # kernel's side of a hit (TCG keeps translations per process), ~0.1 s that a hit
            # would otherwise pay. Then the interpreter for the hit: a new process, whose own
            # first-time work the bootstraps do before their ready (guest/src/bootstrap.c). A
            # clone of a template that holds a parked interpreter has the first one already
            # (one interpreter start, and its memory, saved). A template's shell is pre-started
            # only when it is bash (the agent refuses to pre-start sh: guest/src/template.c).
            parked = phases.l1_hit and template_holds_interpreter(language)
            if not _can_prestart(language, template):
                await vm.warm_up(language)
            elif parked or await vm.prestart(language):
                await vm.warm_up(language)
                await vm.prestart(language)
            else:
                await vm.warm_up(language)
        except BaseException:
            vm.close()
            raise
        return vm, phases.l1_hit

    # --- L1 snapshot builds ---

    async def prepare_snapshot(
        self, language: Language, memory_mb: int, specs: tuple[PackageSpec, ...]
    ) -> bool:
        """Scheduler.prepare_snapshot(): the snapshot of this configuration exists or is built
        now. False when snapshots are off or the build failed."""
        if self.snapshots is None:
            return False
        layer = await self.layer_for(language, specs, None)
        spec = self.spec(memory_mb, layer, disk_mb=self.config.default_disk_mb)
        key = snapshot_key(spec, language)
        if self.snapshots.lookup(key, memory_mb) is not None:
            return True
        task = self.schedule_snapshot(spec, language, key, force=True)
        return task is not None and await asyncio.shield(task) is not None

    async def wait_snapshots(self, timeout: float | None) -> bool:
        """Scheduler.wait_snapshots(): True when no build is left in progress."""
        builds = list(self._snapshot_builds.values())
        if not builds:
            return True
        _done, pending = await asyncio.wait(builds, timeout=timeout)
        return not pending

    def schedule_snapshot(
        self, spec: VmSpec, language: Language, key: str, *, force: bool = False
    ) -> asyncio.Task[Snapshot | None] | None:
        """Build the snapshot for key in the background (once at a time per key; a key that
        failed is not retried by this scheduler unless forced)."""
        if self.snapshots is None or self._registry.closed:
            return None
        task = self._snapshot_builds.get(key)
        if task is not None:
            return task
        if key in self._snapshot_failed and not force:
            return None
        task = asyncio.create_task(
            self._build_snapshot(spec, language, key), name=f"snapshot-{key}"
        )
        self._snapshot_builds[key] = task
        task.add_done_callback(lambda _t: self._snapshot_builds.pop(key, None))
        return task

    async def _build_snapshot(self, spec: VmSpec, language: Language, key: str) -> Snapshot | None:
        assert self.snapshots is not None
        await self.foreground.wait_quiet()
        ticket = await self._admission.acquire(spec.memory_mb, spec.vcpus, background=True)
        try:
            at = time.monotonic()
            snapshot = await self.snapshots.build(
                spec,
                language,
                key,
                boot_timeout=limits.BOOT_TIMEOUT_SECONDS,
                boot=functools.partial(self.factory.boot, registry=self._registry),
            )
            log.info("memory snapshot %s built in %.1f s", key, time.monotonic() - at)
            self._snapshot_failed.discard(key)
            return snapshot
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A build the scheduler's close() cut short failed for that reason only.
            log.log(
                logging.DEBUG if self._registry.closed else logging.WARNING,
                "building memory snapshot %s failed (%s): fresh VMs of this "
                "configuration cold boot",
                key,
                exc,
            )
            self._snapshot_failed.add(key)
            return None
        finally:
            ticket.release()


def _can_prestart(language: Language, template: Template | None) -> bool:
    """Whether the agent pre-starts language's interpreter in a VM of template: always, but for
    a template's raw shell, which must be bash (a sh has no bootstrap)."""
    return template is None or language != "raw" or template.languages.get("raw") == "bash"


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
