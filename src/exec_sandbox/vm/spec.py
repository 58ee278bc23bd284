"""What decides how one VM is started (`VmSpec`): a pure value, read by the C boundary
(`binding.start_qemu`), the snapshot keys (`snapshots/identity.py`) and provisioning. Who owns
a VM once it runs (`registry.VmRegistry`) is not part of it: it is handed to the launcher."""

from __future__ import annotations

from dataclasses import dataclass

from ..images.catalog import GuestImages
from ..packages.layer import PackageLayer


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
    # The network port (network/): a third virtio-serial port for allow_network or
    # expose_ports. Part of the device layout, hence of the snapshot keys.
    net_port: bool = False
