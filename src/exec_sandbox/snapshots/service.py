"""The one owner of paused and forked sessions (`SessionSnapshotService`).

`Session.pause()` / `Session.fork()` and `Scheduler.resume()` / `snapshots()` /
`delete_snapshot()` each forward here in one line. The service holds what those need and the
scheduler owns: the paused-session store (sessions.py), admission (a copy or a resumed session
takes a ticket like any VM), the provisioner (the machine a state loads into, the package layer
cache) and the scheduler's VM registry and leases. It makes no Session itself: `adopt` (the
scheduler's) turns a lease into one, so a resumed or forked session is registered, closed and
timed out like an opened one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, MutableSet
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .. import limits
from ..errors import InputValidationError, SnapshotError, TemplateError
from ..installs import RuntimeLayer, runtime_from_meta
from ..models import Language, PackagesReport, SessionSnapshot
from ..network.request import NetworkRequest, request_from_meta, request_to_meta
from ..packages.layer import PackageLayer
from ..provisioning.admission import Admission
from ..provisioning.lease import Lease
from ..provisioning.provisioner import Provisioner
from ..vm.execution import OutputCallback
from ..vm.guest import GuestVm
from ..vm.registry import VmRegistry
from ..vm.spec import TemplateDisk
from ..volumes import VolumeClaims, kernel_cmdline
from .forks import check_machine, fork_vms, load_vm, save_session
from .sessions import SessionSnapshotStore, check_id

if TYPE_CHECKING:
    from ..host_tools import HostTools
    from ..session import Session


@dataclass(frozen=True)
class Adoption:
    """What a Session made from a lease starts with besides its VM (`adopt`'s input)."""

    language: Language
    timeout: float
    env: dict[str, str]
    on_stdout: OutputCallback | None
    on_stderr: OutputCallback | None
    boot_ms: int
    packages: PackagesReport | None
    exec_count: int = 0
    # Which speed tier gave the VM: a resumed or forked session's is a loaded state (L1).
    warm_pool_hit: bool = False
    l1_cache_hit: bool = True
    tools: HostTools | None = None
    # What installs added to the VM (installs.py), carried by its work disk.
    installed: tuple[RuntimeLayer, ...] = ()


class Adopt(Protocol):
    """The scheduler's: a registered Session owning lease (its VM and admission ticket)."""

    def __call__(self, lease: Lease[GuestVm], adoption: Adoption) -> Session: ...


class AttachNetwork(Protocol):
    """The scheduler's: give a VM restored from a state saved with network (a resumed session,
    a fork's copy) its network again under request, the guest told to reattach. fresh_ports:
    every exposed port on a new host port (a copy; the parent keeps its own). On failure the
    caller closes the VM."""

    def __call__(
        self, request: NetworkRequest, vm: GuestVm, *, fresh_ports: bool
    ) -> Awaitable[None]: ...


class SessionSnapshotService:
    def __init__(
        self,
        store: SessionSnapshotStore,
        admission: Admission,
        provisioner: Provisioner,
        registry: VmRegistry,
        leases: MutableSet[Lease[GuestVm]],
        adopt: Adopt,
        check_open: Callable[[], None],
        start: Callable[[], Awaitable[None]],
        attach_network: AttachNetwork,
    ) -> None:
        self.store = store
        self._admission = admission
        self._provisioner = provisioner
        self._registry = registry
        self._leases = leases
        self._adopt = adopt
        self._check_open = check_open
        self._start = start  # the scheduler's: finds the host, starts its warm pool
        self._attach_network = attach_network

    # --- Scheduler ---

    async def resume(
        self,
        snapshot_id: str | SessionSnapshot,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        tools: HostTools | None = None,
        volumes: VolumeClaims | None = None,
    ) -> Session:
        """A live Session from a paused one (see Scheduler.resume). volumes: the locked
        volumes its VM had (the caller's: closed by the caller if this fails)."""
        snapshot_id = check_id(snapshot_id)
        self._check_open()
        await self._start()
        meta = await self.store.load(snapshot_id)
        layer = await self._layer_of(meta)
        template = await self._template_of(meta)
        machine = meta["machine"]
        spec = self._provisioner.spec(
            int(machine["memory_mb"]),
            layer,
            int(machine.get("vcpus", limits.DEFAULT_VCPUS)),
            template,
            # A snapshot of a VM without a work disk (made before there were any) resumes
            # without one: its guest has /home/user in RAM.
            int(machine.get("disk_mb", 0)),
        )
        if volumes is not None and volumes.attaches:
            extra = f"{spec.kernel_cmdline_extra} {kernel_cmdline(volumes.attaches)}".strip()
            spec = replace(spec, volumes=volumes, kernel_cmdline_extra=extra)
        network = _network_of(meta)
        if network is not None:  # the device the saved state has; its relay comes after
            spec = replace(spec, net_port=True)
        check_machine(meta, spec)
        settings = meta["session"]
        try:
            installed = runtime_from_meta(settings.get("installed"))
        except ValueError as exc:
            raise SnapshotError(f"session snapshot {snapshot_id} is unreadable: {exc}") from None
        at = 0.0

        async def load() -> GuestVm:
            nonlocal at
            state = await self.store.open_verified(snapshot_id, meta)
            try:
                at = time.monotonic()
                disk = await self.store.disk_copy(snapshot_id, meta, spec)
                return await load_vm(
                    spec,
                    f"/proc/self/fd/{state}",
                    registry=self._registry,
                    timeout=limits.RESTORE_TIMEOUT_SECONDS,
                    disk=disk,
                )
            finally:
                os.close(state)

        ticket = await self._admission.acquire(spec.memory_mb, spec.vcpus)
        lease = await Lease.acquire(ticket, load, self._leases)
        if network is not None:
            try:
                await self._attach_network(network, lease.vm, fresh_ports=False)
            except BaseException:
                await lease.release()
                raise
        return self._adopt(
            lease,
            Adoption(
                language=meta["language"],
                timeout=settings["timeout"],
                env=settings["env"],
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                boot_ms=_ms(time.monotonic() - at),
                packages=None if layer is None else layer.report,
                exec_count=settings["exec_count"],
                tools=tools,
                installed=installed,
            ),
        )

    async def snapshots(self) -> list[SessionSnapshot]:
        """The paused sessions on disk (this user's, every process's), oldest first."""
        return await self.store.entries()

    async def delete(self, snapshot_id: str | SessionSnapshot) -> bool:
        """Remove a paused session; False when there was none of that id."""
        return await self.store.delete(check_id(snapshot_id))

    # --- Session (through SessionHooks) ---

    async def pause(self, session: Session) -> SessionSnapshot:
        """Save session's whole state as a new snapshot. A failed save runs the VM on
        (migration): the session goes on, unpaused. The caller closes the session."""
        return await save_session(session.vm, self.store, await self._meta(session))

    async def fork(self, session: Session, count: int) -> list[Session]:
        """count live copies of session, each with its own admission ticket."""
        vm = session.vm
        tickets = []
        copies: list[GuestVm] = []
        try:
            for _ in range(count):
                tickets.append(await self._admission.acquire(vm.spec.memory_mb, vm.spec.vcpus))
            async with self.store.build_dir() as work:
                at = time.monotonic()
                copies = await fork_vms(vm, count, work, timeout=limits.RESTORE_TIMEOUT_SECONDS)
            network = None if vm.network is None else vm.network.request
            if network is not None:  # each copy its own relay and exposed ports
                for copy in copies:
                    await self._attach_network(network, copy, fresh_ports=True)
        except BaseException:
            # Cancelled while the work directory was removed: the copies exist but are nobody's.
            for copy in copies:
                copy.close()
            for ticket in tickets:
                ticket.release()
            raise
        adoption = Adoption(
            language=session.language,
            timeout=session.default_timeout,
            env=session.default_env,
            on_stdout=None,
            on_stderr=None,
            boot_ms=_ms(time.monotonic() - at),
            packages=session.packages,
            exec_count=session.exec_count,
            tools=session.tools,  # a copy's code calls what its parent's could
            installed=tuple(session.installs.runtime) if session.installs else (),
        )
        return [
            self._adopt(Lease(copy, ticket, self._leases), adoption)
            for copy, ticket in zip(copies, tickets, strict=True)
        ]

    # --- what a snapshot records of its session ---

    async def _meta(self, session: Session) -> dict[str, object]:
        layer = session.vm.spec.layer
        template = session.vm.spec.template
        network = session.vm.network
        return {
            # The network request, set up again on resume (the relay and listeners are host
            # state); None: a VM without the network port.
            "network": None
            if network is None or network.request is None
            else request_to_meta(network.request),
            "language": session.language,
            "session": session.settings(),
            "layer": None if layer is None else await self._layer_meta(layer),
            "template": None if template is None else template.digest,
            "packages": [] if session.packages is None else list(session.packages.packages),
        }

    async def _layer_meta(self, layer: PackageLayer) -> dict[str, object]:
        """With size and digest, the snapshot keeps its own link to the layer's image
        (forks.save_session) and resumes after the package cache evicted it."""
        stored = await self._provisioner.layers.store.lookup(layer.key)
        if stored is None:
            return {"key": layer.key, "kind": layer.kind}
        return {
            "key": layer.key,
            "kind": layer.kind,
            "size": stored.size,
            "sha256": stored.meta.get("sha256"),
        }

    async def _template_of(self, meta: dict[str, Any]) -> TemplateDisk | None:
        """The template disk a paused session's VM had: the same image (by digest) again."""
        digest = meta.get("template")
        if not digest:
            return None
        try:
            path = await self._provisioner.templates.verified(str(digest))
        except TemplateError as exc:
            raise SnapshotError(f"session snapshot {meta.get('id')}: {exc}") from None
        return TemplateDisk(path, str(digest))

    async def _layer_of(self, meta: dict[str, Any]) -> PackageLayer | None:
        """The package layer a paused session's VM had (its disk must be the same again): the
        cache's, else the snapshot's own copy."""
        saved = meta.get("layer")
        if not saved:
            return None
        stored = await self._provisioner.layers.store.lookup(str(saved["key"]))
        if stored is not None:
            path, size = stored.path, stored.size
        else:
            copy = await self.store.layer_copy(str(meta["id"]), meta)
            if copy is None:
                raise SnapshotError(
                    f"session snapshot {meta.get('id')} needs package layer {saved['key']}, "
                    "which is no longer in the package cache (and the snapshot holds no intact "
                    "copy of it)"
                )
            path, size = copy, int(saved["size"])
        report = PackagesReport(
            packages=tuple(meta.get("packages") or ()),
            cache_hit=True,
            resolved=False,
            size_bytes=size,
        )
        return PackageLayer(
            key=str(saved["key"]), path=path, kind=str(saved["kind"]), report=report
        )


def _network_of(meta: dict[str, Any]) -> NetworkRequest | None:
    """The network request a paused session's VM had (None: none), validated again."""
    saved = meta.get("network")
    if saved is None:
        return None
    try:
        return request_from_meta(saved)
    except InputValidationError as exc:  # NetworkValidationError
        raise SnapshotError(f"session snapshot {meta.get('id')}: network: {exc}") from None


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
