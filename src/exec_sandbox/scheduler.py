"""Scheduler: the entry point. Owns every VM it starts and destroys them all on exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Unpack

from . import _logging, limits
from .config import SchedulerConfig
from .errors import InputValidationError, SandboxError, SnapshotError
from .host_tools import HostTools, ToolFunction
from .installs import InstallLimits, InstallService
from .models import (
    ExecutionResult,
    Language,
    LanguageName,
    SessionSnapshot,
    Template,
    TimingBreakdown,
)
from .network.attach import NetworkSetup
from .network.hub import NetworkHub
from .network.names import NetworkValidationError
from .network.request import NetworkRequest, with_free_ports
from .packages.layer import PackageLayer
from .packages.specs import validate_packages
from .provisioning.admission import Admission, Budget
from .provisioning.lease import Lease
from .provisioning.pool import PooledVm, PoolKey, WarmPool
from .provisioning.provisioner import Foreground, Phases, Provisioner, VmFactory
from .results import shape_result
from .run_request import NO_CALLBACKS, Callbacks, RunOptions, RunRequest
from .session import Session, SessionHooks
from .snapshots.service import Adoption, SessionSnapshotService
from .snapshots.sessions import SessionSnapshotStore, check_id
from .templates.build import BuildRequest
from .templates.service import TemplateService
from .templates.steps import Step
from .validation import validate_language, validate_memory
from .vm.execution import ExecRequest, OutputCallback
from .vm.guest import GuestVm
from .vm.jail import usage_figures
from .vm.process import wait_released
from .vm.registry import VmRegistry
from .vm.spec import TemplateDisk
from .volumes import Volume, VolumeClaims, VolumeStore

log = logging.getLogger("exec_sandbox")


class Scheduler:
    """Runs code in disposable microVMs.

    Use as `async with Scheduler(config) as scheduler:`; leaving the block kills every VM the
    scheduler still owns. Admission control (`admission.py`) bounds the VMs, guest RAM and
    vCPUs in use; further calls wait in a bounded queue, then raise VmCapacityError.

    A call is served by the fastest path that matches its configuration: an idle VM of the warm
    pool (`warm_pool_size`), else a clone of an L1 memory snapshot, else a cold boot (which also
    schedules the snapshot for that configuration in the background).
    """

    def __init__(
        self, config: SchedulerConfig | None = None, *, _vm_factory: VmFactory | None = None
    ) -> None:
        """`_vm_factory` (unit tests only): where VMs come from instead of QEMU
        (provisioning.VmFactory)."""
        _logging.configure_from_env()
        self.config = config if config is not None else SchedulerConfig()
        max_vms = self.config.max_concurrent_vms or 1
        self._admission = Admission(
            Budget.for_host(
                max_vms, self.config.memory_overcommit_ratio, self.config.cpu_overcommit_ratio
            ),
            max_waiters=self.config.admission_queue_size or 4 * max_vms,
            wait_timeout=self.config.admission_timeout_seconds,
        )
        # The VMs handed out (runs, sessions) with their admission tickets (lease.py).
        self._leases: set[Lease[GuestVm]] = set()
        # Every VM this scheduler spawned, booting ones included (close() kills them all).
        self._registry = VmRegistry()
        self._sessions: set[Session] = set()
        self._network_hub: NetworkHub | None = None  # network/hub.py, started on first use
        self._started = False
        self._closed = False
        # run() calls and session openings in progress: background work (pool refills, snapshot
        # builds) waits until there is none before it starts a VM, so that on a small host it
        # never competes with a request for CPU.
        self._foreground = Foreground()
        self._provisioner = Provisioner(
            self.config, self._admission, self._registry, self._foreground, _vm_factory
        )
        self._paused = SessionSnapshotService(
            SessionSnapshotStore(
                self.config.memory_snapshot_cache_dir / "sessions",
                ttl_seconds=self.config.session_snapshot_ttl_seconds,
                max_bytes=self.config.session_snapshot_max_mb << 20,
            ),
            self._admission,
            self._provisioner,
            self._registry,
            self._leases,
            self._adopt_session,
            self._check_open,
            self.start,
            self._reattach_network,
        )
        # The pool gets its VMs from provisioning, never from the scheduler, and the templates
        # of its template pools from the template store.
        self._pool = WarmPool(
            self.config.warm_pool_size,
            self.config.default_memory_mb,
            limits.DEFAULT_VCPUS,
            self._admission,
            self._provisioner.start_pool_vm,
            self._foreground.wait_quiet,
            self._provisioner.templates.get,
        )
        self._admission.set_reclaim(self._pool.reclaim_one)
        self._templates = TemplateService(
            self.config,
            self._provisioner,
            self._admission,
            self._leases,
            self._hub,
            self._start_open,
        )
        # Volumes (volumes/): named disks of this host, locked by each VM that has them, and
        # kept for paused sessions while their snapshots exist.
        self._volumes = VolumeStore.beside_sessions(
            self.config.volume_dir, self.config.memory_snapshot_cache_dir / "sessions"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the scheduler is closed")

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Find QEMU, the accelerator and the images; raises VmPermanentError if one is missing.
        Starts filling the warm pool in the background."""
        if self._started:
            return
        await self._provisioner.start()
        self._started = True
        log.debug(
            "scheduler ready: accel=%s images=%s", self._provisioner.accel, self._provisioner.images
        )
        if not self._closed:
            self._pool.start()

    async def close(self) -> None:
        """Stop the pool and snapshot builds and kill every VM this scheduler owns, booting ones
        included: once this returns no QEMU of the scheduler runs, and every call in flight ends
        with a SandboxError. Idempotent."""
        self._closed = True
        # First: a boot that would finish while the steps below await must not hand out a VM.
        self._registry.close()
        for session in list(self._sessions):
            await session.close()
        self._admission.close()
        await self._pool.close()
        await self._provisioner.close()
        for lease in list(self._leases):
            lease.discard()
        if self._network_hub is not None:
            self._network_hub.close()
            self._network_hub = None
        self._registry.close()  # whatever the steps above started while they ran
        await self._registry.wait_started()
        # Every QEMU killed so far (here, by retired runs, the pool, sessions) reaped and its
        # cgroup gone before this returns: nothing of the scheduler outlives close().
        await wait_released()
        self._provisioner.close_snapshot_cache()

    def foreground(self) -> contextlib.AbstractContextManager[None]:
        """Mark a request in progress for longer than run()'s own span (a server's, until its
        answer is sent): background work (pool refills, snapshot builds) waits for it, as it
        waits for run() calls, instead of competing with it for CPU."""
        return self._foreground.busy()

    @property
    def accelerator(self) -> str:
        return self._provisioner.accel

    def capacity(self) -> HostCapacity:
        """What this scheduler could take now: a snapshot of admission and the warm pool, read
        without waiting (the cluster's placement asks each host for it: exec_sandbox.cluster)."""
        vms, memory, vcpus = self._admission.in_use
        budget = self._admission.budget
        return HostCapacity(
            max_vms=budget.max_vms,
            vms_in_use=vms,
            free_vms=max(0, budget.max_vms - vms),
            free_memory_mb=max(0, budget.memory_mb - memory),
            free_vcpus=max(0, budget.vcpus - vcpus),
            waiting=self._admission.foreground_waiting,
            warm_pool={str(key): idle for key, idle in self._pool.idle_by_key().items()},
            sessions=len(self._sessions),
        )

    async def wait_pool_ready(self, timeout: float | None = None) -> None:
        """Wait until the warm pool holds its ready VMs for every pool (`warm_pool_size`, cut to
        what admission admits at once; at once when the pool is off). A template's pool whose
        template is not built (or lacks the language) is not waited for: it fills in the
        background once the template is there. Raises SandboxError when the rest cannot fill
        (pool closed, VMs failing to start; pool.py), and asyncio.TimeoutError after `timeout`
        seconds."""
        await self.start()
        await self._pool.wait_ready(timeout)

    async def prepare_snapshot(
        self,
        language: LanguageName = "python",
        memory_mb: int | None = None,
        packages: Sequence[str] | None = None,
    ) -> bool:
        """Make sure the L1 memory snapshot for this configuration exists (building it now if
        needed, and its package layer), so that the next fresh VM of it is restored instead of
        booted. False when snapshots are off or could not be built (the reason is logged)."""
        language = validate_language(language)
        memory = validate_memory(self.config.default_memory_mb if memory_mb is None else memory_mb)
        requested = validate_packages(
            packages, language, strict=self.config.enable_package_validation
        )
        specs = self._provisioner.packages_of(language, requested)
        await self.start()
        return await self._provisioner.prepare_snapshot(language, memory, specs)

    async def wait_snapshots(self, timeout: float | None = None) -> bool:
        """Wait for the L1 snapshot builds in progress (started by cold boots or
        prepare_snapshot()) to finish, at most `timeout` seconds; they go on in the background
        if it expires. True when none is left in progress. A process about to exit calls this
        so that its build is published rather than cancelled by close() (`sbx run` does)."""
        return await self._provisioner.wait_snapshots(timeout)

    async def build_template(
        self,
        name: str,
        *,
        image: str | os.PathLike[str] | None = None,
        base: str = "default",
        steps: Sequence[Step] = (),
        allowed_domains: Sequence[str] | None = None,
        memory_mb: int | None = None,
        vcpus: int | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> Template:
        """Build (or find built) the template `name` (docs/templates.md): from `image` (a
        registry reference, an OCI layout directory, an OCI or `docker save` archive) or on
        `base` (the default image or another template), then `steps` (Run, Copy, Env, Workdir,
        User) in a builder VM whose network reaches only `allowed_domains` (none when None).
        memory_mb and vcpus become the defaults of its runs. on_progress gets status lines and
        the steps' output. Raises InputValidationError before anything starts, TemplateError
        (TemplateBuildError for a failed step) after."""
        request = BuildRequest.make(
            name,
            image=image,
            base=base,
            steps=steps,
            allowed_domains=allowed_domains,
            memory_mb=memory_mb,
            vcpus=vcpus,
        )
        template = await self._templates.build(request, on_progress)
        # Its warm pools (if any) drop VMs of an older build and fill now.
        self._pool.template_changed(template.name, template)
        return template

    async def templates(self) -> list[Template]:
        """The templates built on this machine, by name."""
        return await self._templates.list()

    async def delete_template(self, name: str) -> bool:
        """Forget the template `name` (its image goes once nothing else names it and the
        cache needs the room); False when there was none. A paused session of it resumes only
        while its image is still in the cache."""
        deleted = await self._templates.delete(name)
        if deleted:
            self._pool.template_changed(name, None)
        return deleted

    # --- volumes: volumes/ owns them ---

    async def volume(self, name: str, *, size_mb: int | None = None) -> Volume:
        """The volume `name` of this host, made empty at size_mb MB if there is none (sparse:
        it takes room as guests write; without size_mb it must exist). Attach it with
        run()/session(volumes={"/mnt/data": volume}), or `volume.read_only()`. VolumeError for
        an existing one of another size, or none without size_mb."""
        return await self._volumes.create(name, size_mb)

    async def volumes(self) -> list[Volume]:
        """The volumes of this host (SchedulerConfig.volume_dir), by name."""
        return await self._volumes.list()

    async def delete_volume(self, name: str | Volume) -> bool:
        """Delete a volume and its content; False when there was none. VolumeInUseError while
        a VM (of any process) has it attached."""
        return await self._volumes.delete(name.name if isinstance(name, Volume) else name)

    async def _start_open(self) -> None:
        self._check_open()
        await self.start()

    async def run(self, code: str, **options: Unpack[RunOptions]) -> ExecutionResult:
        """Run `code` in a fresh VM that is destroyed afterwards (options: run_request.RunOptions).

        Returns the result for any exit of the code (0, n, 128+signal, -1 on timeout). Raises
        InputValidationError for bad input (before any VM starts), OutputLimitError when the
        code printed more than the limits, VmCapacityError when the host has no room within
        the admission timeout, and TransientError/PermanentError/CommunicationError for
        infrastructure failures.
        """
        started = time.monotonic()
        request = RunRequest.make(options, self.config, code=code, defaults=False)
        return await self.run_request(request, Callbacks.of(options), started=started)

    async def run_request(
        self,
        request: RunRequest,
        callbacks: Callbacks = NO_CALLBACKS,
        *,
        started: float | None = None,
    ) -> ExecutionResult:
        """run() of a request made already (the cluster's hosts get requests, not options)."""
        started = time.monotonic() if started is None else started
        if request.code is None:
            raise InputValidationError("run() needs code")
        request, template = await self._templates.resolve(request)
        at = time.monotonic()
        layer = await self._layer(request, callbacks)
        packages_ms = _ms(time.monotonic() - at)
        net = await self._network(request)
        try:
            with self._foreground.busy():
                result = await self._run(request, callbacks, net, layer, template, started)
        finally:
            if net is not None:
                net.discard()
        if layer is None:
            return result
        return replace(
            result, packages=layer.report, timing=replace(result.timing, packages_ms=packages_ms)
        )

    async def _run(
        self,
        request: RunRequest,
        callbacks: Callbacks,
        net: NetworkSetup | None,
        layer: PackageLayer | None,
        template: TemplateDisk | None,
        started: float,
    ) -> ExecutionResult:
        assert request.code is not None
        lease, phases = await self._acquire_lease(
            request, net is not None, layer, template, callbacks.on_boot_log
        )
        vm = lease.vm
        exposed = [] if net is None else net.exposed
        try:
            if net is not None:
                await net.attach(self._hub(), vm)
            setup_ms = (
                _ms(time.monotonic() - started)
                - phases.boot_ms
                - phases.restore_ms
                - phases.connect_ms
            )
            ready_at = time.monotonic()
            outcome = await vm.execute(
                ExecRequest(
                    language=request.language,
                    code=request.code,
                    timeout_ms=request.timeout_ms,
                    env=request.wire_env + ([] if net is None else _wire(net.placeholder_env)),
                    stdout_limit=limits.STDOUT_LIMIT_BYTES,
                    stderr_limit=limits.STDERR_LIMIT_BYTES,
                    on_stdout=callbacks.on_stdout,
                    on_stderr=callbacks.on_stderr,
                    tools=callbacks.tools,
                )
            )
            done_at = time.monotonic()
            # The figures so far: the VM has done its work; it is destroyed after the return.
            # Read in a thread: cgroupfs reads can wait on kernel locks for milliseconds.
            usage = await asyncio.get_running_loop().run_in_executor(None, vm.resource_usage)
            cpu_ms, peak_mb = usage_figures(usage)
        except BaseException:
            # A failed or cancelled run() ends only once its QEMU is reaped: the caller may
            # count on nothing of it running (the reap is quick: QEMU was SIGKILLed).
            await lease.release()
            raise
        # Destroyed on the loop's next turn: killing QEMU is then not part of the caller's wait
        # (its reap and cgroup removal happen off the loop, and close() waits for them). Until
        # then it is in self._leases, so close() still destroys it.
        if request.volumes:
            # Its volumes are free again once run() returns: the VM is reaped first.
            await lease.release()
        else:
            asyncio.get_running_loop().call_soon(lease.discard)

        return shape_result(
            outcome,
            timeout_seconds=request.timeout,
            in_session=False,
            timing=TimingBreakdown(
                setup_ms=max(0, setup_ms),
                boot_ms=phases.boot_ms,
                execute_ms=_ms(done_at - ready_at),
                total_ms=_ms(time.monotonic() - started),
                admission_ms=phases.admission_ms,
                restore_ms=phases.restore_ms,
                connect_ms=phases.connect_ms,
            ),
            cpu_ms=cpu_ms,
            peak_mb=peak_mb,
            warm_pool_hit=phases.pool_hit,
            l1_cache_hit=phases.l1_hit,
            exposed_ports=exposed,
            network_log=[] if vm.network is None else vm.network.log,
        )

    async def _layer(self, request: RunRequest, callbacks: Callbacks) -> PackageLayer | None:
        """Start the scheduler if it is not (refused once closed), then the request's package
        layer with the scheduler's default packages: cached, or built now (None: no packages,
        or a template, which brings its own)."""
        self._check_open()
        await self.start()
        if request.template is not None:
            return None
        specs = self._provisioner.packages_of(request.packages_language, request.packages)
        return await self._provisioner.layer_for(
            request.packages_language, specs, callbacks.on_boot_log
        )

    async def _network(self, request: RunRequest) -> NetworkSetup | None:
        """The request's listeners bound and CA bundle read, before any VM starts."""
        if request.network is None:
            return None
        return await NetworkSetup.prepare(request.network, self.config)

    async def _reattach_network(
        self, request: NetworkRequest, vm: GuestVm, *, fresh_ports: bool
    ) -> None:
        """A resumed session's or a fork's copy's network (snapshots/service.py AttachNetwork):
        listeners bound again (a fixed host port when it is free, else a new one), the VM's
        port relayed, the guest told to reattach."""
        if fresh_ports:
            request = with_free_ports(request)
        try:
            net = await NetworkSetup.prepare(request, self.config)
        except NetworkValidationError:  # a fixed host port is taken meanwhile: a free one
            net = await NetworkSetup.prepare(with_free_ports(request), self.config)
        try:
            await net.attach(self._hub(), vm, reattach=True)
        finally:
            net.discard()

    def _hub(self) -> NetworkHub:
        """The scheduler's network relay, started on first use (closed by close())."""
        if self._network_hub is None:
            self._network_hub = NetworkHub(asyncio.get_running_loop())
        return self._network_hub

    async def session(
        self, *, _packages_language: Language | None = None, **options: Unpack[RunOptions]
    ) -> Session:
        """Start a VM for a stateful session (see session.py; options: run_request.RunOptions): an
        idle warm-pool VM, a clone of the L1 snapshot or a cold boot, like run(). The session
        holds its admission ticket until it is closed; timeout_seconds, env_vars and the
        callbacks are defaults for each exec(). The REPL starts only after the restore and its
        RESEED (never in a snapshot).

        `_packages_language` (for integrations): the packages are of that language, not the
        session's; a shell session (raw) can so get python packages for the `python3` it runs."""
        request = RunRequest.make(
            options, self.config, code=None, packages_language=_packages_language, defaults=False
        )
        return await self.session_request(request, Callbacks.of(options))

    async def session_request(
        self, request: RunRequest, callbacks: Callbacks = NO_CALLBACKS
    ) -> Session:
        """session() of a request made already (the cluster's hosts get requests)."""
        request, template = await self._templates.resolve(request)
        layer = await self._layer(request, callbacks)
        net = await self._network(request)
        try:
            with self._foreground.busy():
                lease, phases = await self._acquire_lease(
                    request, net is not None, layer, template, callbacks.on_boot_log
                )
            if net is not None:
                try:
                    await net.attach(self._hub(), lease.vm)
                except BaseException:
                    await lease.release()
                    raise
        finally:
            if net is not None:
                net.discard()
        session = self._adopt_session(
            lease,
            Adoption(
                language=request.language,
                timeout=request.timeout,
                env={**request.env, **({} if net is None else net.placeholder_env)},
                on_stdout=callbacks.on_stdout,
                on_stderr=callbacks.on_stderr,
                boot_ms=phases.boot_ms + phases.restore_ms,
                warm_pool_hit=phases.pool_hit,
                l1_cache_hit=phases.l1_hit,
                packages=None if layer is None else layer.report,
                tools=callbacks.tools,
            ),
        )
        try:
            await session.start_repl()
        except BaseException:
            await session.close()
            raise
        return session

    def _adopt_session(self, lease: Lease[GuestVm], adoption: Adoption) -> Session:
        """A registered Session owning lease (its VM and admission ticket, released when it
        closes): an opened, resumed or forked one."""
        session = Session(
            lease,
            language=adoption.language,
            default_timeout_seconds=adoption.timeout,
            default_env=adoption.env,
            on_stdout=adoption.on_stdout,
            on_stderr=adoption.on_stderr,
            idle_timeout_seconds=self.config.session_idle_timeout_seconds,
            on_close=self._sessions.discard,
            boot_ms=adoption.boot_ms,
            warm_pool_hit=adoption.warm_pool_hit,
            l1_cache_hit=adoption.l1_cache_hit,
            packages=adoption.packages,
            tools=adoption.tools,
            hooks=SessionHooks(
                pause=self._pause_session,
                fork=self._fork_session,
                pause_when_idle=self.config.session_idle_action == "pause",
            ),
            exec_count=adoption.exec_count,
            installs=self._install_service(adoption),
        )
        self._sessions.add(session)
        return session

    def _install_service(self, adoption: Adoption) -> InstallService | None:
        """The installs of one session's VM (installs.py); None without guest facts (images
        that predate package support)."""
        images = self._provisioner.images
        if images is None or images.guest is None:
            return None
        return InstallService(
            self._provisioner.layers,
            images,
            InstallLimits(
                enabled=self.config.allow_guest_installs,
                max_installs=self.config.guest_installs_max,
                max_bytes=self.config.guest_installs_max_mb << 20,
                strict=self.config.enable_package_validation,
            ),
            boot=adoption.packages,
            boot_kind=adoption.language,
            runtime=adoption.installed,
        )

    # --- paused and forked sessions: snapshots/service.py owns them ---

    async def resume(
        self,
        snapshot_id: str | SessionSnapshot,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        tools: Mapping[str, ToolFunction] | None = None,
    ) -> Session:
        """A live Session from a paused one (`Session.pause()`), with its variables, imports,
        cwd, env and files; the snapshot stays (resume it again, or delete_snapshot()). Host
        tools are not part of a snapshot: give them again (`tools`). Raises SnapshotError for
        an unknown, damaged or foreign snapshot (other images or QEMU). A session paused with
        (read-only) volumes gets them again, at the same paths."""
        volumes = None
        attaches = await self._volumes.snapshot_volumes(check_id(snapshot_id))
        if attaches:
            volumes = await self._volumes.claim(attaches)
        try:
            return await self._paused.resume(
                snapshot_id,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                tools=HostTools.of(tools),
                volumes=volumes,
            )
        except BaseException:
            if volumes is not None:
                volumes.close()  # also the VM's, if one started: it is gone
            raise

    async def snapshots(self) -> list[SessionSnapshot]:
        """The paused sessions on disk (this user's, every process's), oldest first."""
        return await self._paused.snapshots()

    async def delete_snapshot(self, snapshot_id: str | SessionSnapshot) -> bool:
        """Remove a paused session; False when there was none of that id. Its volumes, if
        any, may be written again."""
        deleted = await self._paused.delete(snapshot_id)
        await self._volumes.release_snapshot(check_id(snapshot_id))
        return deleted

    async def _pause_session(self, session: Session) -> SessionSnapshot:
        # Read-only volumes are kept for the snapshot (its memory has them mounted): no
        # writer until it is deleted. The VM holds their locks until after this returns.
        _refuse_volumes(session, "paused", read_only_ok=True)
        snapshot = await self._paused.pause(session)
        claims = session.vm.spec.volumes
        if claims is not None and claims.attaches:
            try:
                await self._volumes.hold_for_snapshot(snapshot.id, claims.attaches)
            except BaseException:
                session.vm.close()  # stopped for the save: it ends with its session
                await self._paused.delete(snapshot.id)
                raise
        return snapshot

    async def _fork_session(self, session: Session, count: int) -> list[Session]:
        # Read-only volumes are shared: each copy takes its own lock (GuestVm.spawn).
        _refuse_volumes(session, "forked", read_only_ok=True)
        return await self._paused.fork(session, count)

    async def _acquire_lease(
        self,
        request: RunRequest,
        network: bool,
        layer: PackageLayer | None,
        template: TemplateDisk | None,
        on_boot_log: OutputCallback | None,
    ) -> tuple[Lease[GuestVm], Phases]:
        """A VM and its ticket for one run() or session: the pool first, else admission and
        an L1 restore or a cold boot (provisioning.py). network: the VM gets the network port
        (never a pooled VM: those have none; its L1 snapshots are its own)."""
        if request.volumes:
            # Locked before admission: a volume in use fails at once, not after a wait.
            volumes = await self._volumes.claim(request.volumes)
            try:
                return await self._acquire_lease_inner(
                    request, network, layer, template, on_boot_log, volumes
                )
            except BaseException:
                volumes.close()  # also the VM's, if one started: it is gone
                raise
        return await self._acquire_lease_inner(request, network, layer, template, on_boot_log)

    async def _acquire_lease_inner(
        self,
        request: RunRequest,
        network: bool,
        layer: PackageLayer | None,
        template: TemplateDisk | None,
        on_boot_log: OutputCallback | None,
        volumes: VolumeClaims | None = None,
    ) -> tuple[Lease[GuestVm], Phases]:
        language, memory, vcpus = request.language, request.memory, request.cpus
        phases = Phases()
        pooled = None
        # Pooled VMs have no network port; the default image's have its default packages; all
        # have a work disk of the config's size.
        if (
            not network
            and volumes is None
            and request.disk == self.config.default_disk_mb
            and (template is not None or self._provisioner.pool_serves(language, layer))
        ):
            key = PoolKey(language, request.template)
            digest = None if template is None else template.digest
            pooled = await self._take_pooled(key, memory, vcpus, digest, phases)
        if pooled is not None and self._closed:
            pooled.lease.discard()
            raise SandboxError("the scheduler was closed while the VM started")
        if pooled is not None:
            phases.pool_hit = True
            phases.l1_hit = pooled.restored
            pooled.lease.move_to(self._leases)
            return pooled.lease, phases

        async def start() -> GuestVm:
            vm = await self._provisioner.start_vm(
                language,
                memory,
                phases,
                layer,
                on_boot_log=on_boot_log,
                net_port=network,
                vcpus=vcpus,
                template=template,
                disk_mb=request.disk,
                volumes=volumes,
            )
            if self._closed:
                vm.close()
                raise SandboxError("the scheduler was closed while the VM started")
            return vm

        admit_at = time.monotonic()
        ticket = await self._admission.acquire(memory, vcpus)
        phases.admission_ms = _ms(time.monotonic() - admit_at)
        return await Lease.acquire(ticket, start, self._leases), phases

    async def _take_pooled(
        self, key: PoolKey, memory: int, vcpus: int, digest: str | None, phases: Phases
    ) -> PooledVm | None:
        """A healthy idle VM of pool key started with this RAM, these vCPUs and this template
        digest (the caller owns it), or None (pool.py says what a pooled VM serves).

        Health: the pool hands out only VMs whose QEMU is alive. A VM proved its agent answers
        when it joined the pool (its warm-up and PRESTART are round trips); one idle for longer
        than _POOL_RECHECK_SECONDS is asked again (PING) before use, and dropped if it does not
        answer, the request then taking the next path."""
        while True:
            pooled = self._pool.take(key, memory, vcpus, digest)
            if pooled is None or time.monotonic() - pooled.checked_at < _POOL_RECHECK_SECONDS:
                return pooled
            at = time.monotonic()
            try:
                await pooled.vm.ping(timeout=_POOL_PING_TIMEOUT_SECONDS)
            except SandboxError as exc:
                log.warning("pooled %s VM failed its health check (%s): discarded", key, exc)
                pooled.lease.discard()
                continue
            phases.connect_ms = _ms(time.monotonic() - at)
            return pooled


@dataclass(frozen=True)
class HostCapacity:
    """Scheduler.capacity(): VMs (pooled ones included) against max_concurrent_vms, the guest
    RAM and vCPU budgets left, foreground requests waiting for admission, idle warm-pool VMs
    per pool ("python" for the default image, "go-dev:raw" for a template; each can serve a
    request without a free slot), and open sessions."""

    max_vms: int
    vms_in_use: int
    free_vms: int
    free_memory_mb: int
    free_vcpus: int
    waiting: int
    warm_pool: dict[str, int]
    sessions: int

    def has_room(self, language: str) -> bool:
        """Whether a request of language would be admitted now without waiting: a free slot,
        or an idle pooled VM (of its language, or of another one that admission reclaims)."""
        return self.waiting == 0 and (self.free_vms > 0 or sum(self.warm_pool.values()) > 0)


def _refuse_volumes(session: Session, what: str, *, read_only_ok: bool) -> None:
    """A read-write volume is locked by its one VM: a copy would be a second writer. A paused
    state would hold any volume's file system mounted while another VM changes it."""
    claims = session.vm.spec.volumes
    if claims is None or not claims.attaches or (read_only_ok and not claims.read_write):
        return
    attaches = [a for a in claims.attaches if not (read_only_ok and a.read_only)]
    paths = ", ".join(a.path for a in attaches)
    kind = "read-write volumes" if read_only_ok else "volumes"
    raise SnapshotError(
        f"a session with {kind} ({paths}) cannot be {what}: a volume attached that way "
        f"belongs to one running VM (close the session to release it)"
    )


_POOL_PING_TIMEOUT_SECONDS = 2.0
_POOL_RECHECK_SECONDS = 5.0


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _wire(env: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Variables as the guest protocol carries them (placeholders: ASCII, checked names)."""
    return [(name.encode(), value.encode()) for name, value in env.items()]
