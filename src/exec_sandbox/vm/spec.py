"""What decides how one VM is started (`VmSpec`): read by the C boundary (`_vm.start_qemu`),
the snapshot keys (`snapshots.py`) and the provisioning of VMs (`provisioning.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..images.catalog import GuestImages
from ..packages.layer import PackageLayer

if TYPE_CHECKING:
    from .registry import VmRegistry


@dataclass(frozen=True)
class VmSpec:
    """Everything that decides how one VM is started."""

    qemu_binary: str
    images: GuestImages
    accel: str
    memory_mb: int
    vcpus: int = 1
    kernel_cmdline_extra: str = ""
    # Memory snapshots: guest RAM in this file, mapped shared (making a template) or private
    # (a copy-on-write clone of one); a QMP monitor to drive the migration.
    mem_path: str | None = None
    mem_fd: int | None = None  # instead of mem_path: this fd (kept by the caller) is the RAM
    mem_shared: bool = False
    qmp: bool = False
    # The host jail (jail.py, src/_execsbx/jail.c): None runs QEMU without it.
    jail: dict[str, int] | None = None
    qemu_sandbox: bool = False
    # A package layer (packages/): a read-only EROFS image the guest mounts for this language.
    layer: PackageLayer | None = None
    # The network port (issue 13, network/): a third virtio-serial port for allow_network or
    # expose_ports. Part of the device layout, hence of the snapshot keys.
    net_port: bool = False
    # Where the VM registers itself from spawn to close (not part of what starts the VM).
    registry: VmRegistry | None = field(default=None, compare=False, hash=False)
