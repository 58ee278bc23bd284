"""GUEST STAND-INS for unit tests of the orchestration: a `provisioning.VmFactory` whose VMs are
not VMs but `guest_stand_in_agent.py` processes, spawned by the C core in QEMU's place (real
fork/exec, pidfd, channel decoder, release off the loop) and speaking the agent's frames. They
let a Scheduler's failure branches (pool refills, L1 fallbacks, admission on every failure path,
the session state machine) run in milliseconds. They prove nothing about the sandbox: no guest
kernel runs, no code is executed (an EXEC's code is a script of answers; see the agent).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.images.catalog import GuestImages
from exec_sandbox.provisioning.provisioner import HostSetup
from exec_sandbox.snapshots.l1 import SNAPSHOT_FORMAT
from exec_sandbox.snapshots.ram import ram_digest
from exec_sandbox.vm.binding import PROTOCOL_VERSION
from exec_sandbox.vm.execution import OutputCallback
from exec_sandbox.vm.guest import GuestVm
from exec_sandbox.vm.registry import VmRegistry
from exec_sandbox.vm.spec import VmSpec
from tests.helpers import private_config

_AGENT = Path(__file__).with_name("guest_stand_in_agent.py")
# Boots and restores of stand-ins take milliseconds: a short bound turns a hang into a failure.
STAND_IN_BOOT_TIMEOUT_SECONDS = 20.0


@dataclass
class StandInVms:
    """A VmFactory of guest stand-ins. `boot_modes` / `restore_errors`: what the next boots and
    restores do, first in first out ("ready" or "exit"; an exception to raise, or None to come
    up); empty: they come up. Every start is recorded in `started` as "boot" or "restore"."""

    root: Path
    boot_modes: list[str] = field(default_factory=list)
    restore_errors: list[BaseException | None] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    vms: list[GuestVm] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # The "QEMU binary": the agent behind this interpreter (-I: nothing of the environment).
        self.binary = self.root / "guest-stand-in"
        self.binary.write_text(f"#!{sys.executable} -I\n" + _AGENT.read_text())
        self.binary.chmod(0o755)
        for name in ("kernel", "rootfs"):
            (self.root / name).write_bytes(b"GUEST STAND-IN: not an image\n")

    async def host_setup(self, config: SchedulerConfig) -> HostSetup:
        images = GuestImages(
            kernel=self.root / "kernel",
            rootfs=self.root / "rootfs",
            kernel_hash="stand-in-kernel",
            rootfs_hash="stand-in-rootfs",
        )
        return HostSetup(images, str(self.binary), "tcg", "")

    async def boot(
        self,
        spec: VmSpec,
        *,
        registry: VmRegistry,
        boot_timeout: float,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm:
        self.started.append("boot")
        mode = self.boot_modes.pop(0) if self.boot_modes else "ready"
        return await self._start(spec, registry, mode, on_boot_log)

    async def restore(
        self,
        spec: VmSpec,
        state_path: str,
        *,
        registry: VmRegistry,
        timeout: float,
        on_boot_log: OutputCallback | None,
    ) -> GuestVm:
        self.started.append("restore")
        error = self.restore_errors.pop(0) if self.restore_errors else None
        if error is not None:
            raise error
        vm = await self._start(spec, registry, "ready", on_boot_log)
        vm.restore_seconds = 0.001
        return vm

    async def _start(
        self, spec: VmSpec, registry: VmRegistry, mode: str, on_boot_log: OutputCallback | None
    ) -> GuestVm:
        # No jail, no RAM file: a stand-in needs neither (the jail has its own tests).
        stand_in = replace(
            spec,
            jail=None,
            qemu_sandbox=False,
            mem_fd=None,
            mem_path=None,
            kernel_cmdline_extra=f"standin.version={PROTOCOL_VERSION} standin.boot={mode}",
        )
        vm = await GuestVm.boot(
            stand_in,
            registry=registry,
            boot_timeout=STAND_IN_BOOT_TIMEOUT_SECONDS,
            on_boot_log=on_boot_log,
        )
        self.vms.append(vm)
        return vm

    def live_processes(self) -> list[int]:
        """Pids of stand-ins still running (after a scheduler's close(): none may be)."""
        alive = []
        for vm in self.vms:
            try:
                os.kill(vm.pid, 0)
            except ProcessLookupError:
                continue
            alive.append(vm.pid)
        return alive


def publish_l1_snapshot(
    cache_dir: Path, key: str, memory_mb: int, *, damaged: bool, disk_mb: int = 0
) -> None:
    """A published L1 snapshot directory for key in the snapshot cache's format (snapshots.py):
    a sparse RAM file of the right size and a state file with its hash, and a sparse work disk
    of disk_mb (0: none). damaged: the RAM digest recorded does not match the RAM (what a
    changed RAM file looks like to RamFiles.fd_for)."""
    directory = cache_dir / key
    directory.mkdir(parents=True)
    ram = directory / "ram"
    with open(ram, "wb") as f:
        f.truncate(memory_mb * 1024 * 1024)
    state = directory / "state"
    state.write_bytes(b"GUEST STAND-IN: not a device state stream\n")
    digest = "0" * 64 if damaged else ram_digest(ram)
    meta = {
        "format": SNAPSHOT_FORMAT,
        "key": key,
        "state_sha256": hashlib.sha256(state.read_bytes()).hexdigest(),
        "ram_bytes": memory_mb * 1024 * 1024,
        "ram_digest": digest,
        "disk_bytes": disk_mb << 20,
    }
    if disk_mb:
        with open(directory / "disk", "wb") as f:
            f.truncate(disk_mb << 20)
    (directory / "meta.json").write_text(json.dumps(meta))


@asynccontextmanager
async def stand_in_scheduler(
    tmp_path: Path, vms: StandInVms | None = None, **config: object
) -> AsyncIterator[tuple[Scheduler, StandInVms]]:
    """A Scheduler whose VMs are guest stand-ins (caches under tmp_path, 2 VMs at once unless
    config says otherwise). On exit it is closed, and no stand-in process may outlive it."""
    vms = vms if vms is not None else StandInVms(tmp_path / "stand-in")
    options: dict[str, object] = {"max_concurrent_vms": 2, **config}
    scheduler = Scheduler(private_config(tmp_path, **options), _vm_factory=vms)
    try:
        await scheduler.start()
        yield scheduler, vms
    finally:
        await scheduler.close()
    assert vms.live_processes() == [], "a stand-in outlived Scheduler.close()"
