"""The scheduler's templates: building them (build.py) in builder VMs it owns, listing and
deleting them, and resolving `template=` of a run or session into the disk its VM gets and the
defaults it brings. `Scheduler.build_template/templates/delete_template` forward here."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableSet
from dataclasses import replace

from .. import limits
from ..config import SchedulerConfig
from ..errors import InputValidationError
from ..models import Template
from ..network.attach import NetworkSetup
from ..network.hub import NetworkHub
from ..network.request import NetworkRequest
from ..provisioning.admission import Admission
from ..provisioning.lease import Lease
from ..provisioning.provisioner import Provisioner
from ..run_request import RunRequest
from ..validation import validate_template_name
from ..vm.guest import GuestVm
from ..vm.spec import Disk, TemplateDisk
from .build import BuildRequest, Progress, build_template

log = logging.getLogger("exec_sandbox")

# What tells the agent that this VM builds a template (guest/src: its commands run as root).
BUILDER_CMDLINE = "sbx.builder=1"
_LANGUAGE_PROGRAMS = {"python": "python3", "javascript": "node", "raw": "a shell"}


class TemplateService:
    def __init__(
        self,
        config: SchedulerConfig,
        provisioner: Provisioner,
        admission: Admission,
        leases: MutableSet[Lease[GuestVm]],
        hub: Callable[[], NetworkHub],
        start: Callable[[], Awaitable[None]],
    ) -> None:
        self._config = config
        self._provisioner = provisioner
        self._admission = admission
        self._leases = leases
        self._hub = hub
        self._start = start
        self.store = provisioner.templates

    async def build(self, request: BuildRequest, on_progress: Progress | None) -> Template:
        """Scheduler.build_template() of a request checked already."""
        await self._start()
        images = self._provisioner.images
        assert images is not None
        return await build_template(
            request,
            store=self.store,
            images=images,
            builder_vms=self._builder_vm,
            max_bytes=self._config.template_max_mb << 20,
            progress=on_progress,
        )

    async def list(self) -> list[Template]:
        return await self.store.list()

    async def delete(self, name: str) -> bool:
        return await self.store.delete(validate_template_name(name))

    async def resolve(self, request: RunRequest) -> tuple[RunRequest, TemplateDisk | None]:
        """The request with its template's defaults (then the config's) applied, and the disk
        its VM gets; InputValidationError for an unknown template or a language it lacks."""
        if request.template is None:
            return request.with_defaults(self._config), None
        template = await self.store.get(request.template)
        if template is None:
            raise InputValidationError(
                f"no template named {request.template!r}: build_template() or `sbx template "
                "build` makes one, `sbx template list` shows those there are"
            )
        if request.language not in template.languages:
            served = ", ".join(sorted(template.languages)) or "none"
            raise InputValidationError(
                f"template {template.name!r} has no {_LANGUAGE_PROGRAMS[request.language]} for "
                f"language {request.language!r} (it serves: {served})"
            )
        if (
            request.code is None
            and request.language == "raw"
            and template.languages["raw"] != "bash"
        ):
            # The session's shell driver is a bash script (guest/repl/driver.sh).
            raise InputValidationError(
                f"template {template.name!r} has no bash, which a raw session needs (one-shot "
                "raw runs use its sh)"
            )
        disk = TemplateDisk(await self.store.verified(template.digest), template.digest)
        return request.with_defaults(self._config, template), disk

    @contextlib.asynccontextmanager
    async def _builder_vm(
        self, disks: tuple[Disk, ...], network: NetworkRequest | None
    ) -> AsyncIterator[GuestVm]:
        """A builder VM with these disks, owned for the block: admitted like any VM, killed on
        the way out whatever happens (the scheduler's close() kills it too)."""
        memory = self._config.template_build_memory_mb
        base = self._provisioner.spec(memory)
        spec = replace(
            base,
            extra_disks=disks,
            kernel_cmdline_extra=f"{base.kernel_cmdline_extra} {BUILDER_CMDLINE}".strip(),
            net_port=network is not None,
        )
        net = None if network is None else await NetworkSetup.prepare(network, self._config)
        try:
            ticket = await self._admission.acquire(memory, limits.DEFAULT_VCPUS)
            lease = await Lease.acquire(ticket, lambda: self._provisioner.boot(spec), self._leases)
            try:
                if net is not None:
                    await net.attach(self._hub(), lease.vm)
                yield lease.vm
            finally:
                await lease.release()
        finally:
            if net is not None:
                net.discard()
