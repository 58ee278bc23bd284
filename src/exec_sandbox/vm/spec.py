"""What decides how one VM is started (`VmSpec`): a pure value, read by the C boundary
(`binding.start_qemu`), the snapshot keys (`snapshots/identity.py`) and provisioning. Who owns
a VM once it runs (`registry.VmRegistry`) is not part of it: it is handed to the launcher."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..images.catalog import GuestImages
from ..packages.layer import PackageLayer


@dataclass(frozen=True)
class Disk:
    """A disk after the root (/dev/vdb, ...): a raw image the guest agent finds by its serial
    "sbx-disk-<kind>" (kind: 1..10 lower-case letters, one disk per kind; the C core checks it).
    Read-only unless writable (a builder's output)."""

    path: Path
    kind: str
    writable: bool = False


@dataclass(frozen=True)
class TemplateDisk:
    """A template's image (an EROFS blob of the template store), attached read-only as the disk
    of kind "template"; its digest ("sha256:...") is what keys snapshots of VMs running it."""

    path: Path
    digest: str


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
    # A template (templates/): the environment user code runs in, a read-only EROFS image.
    template: TemplateDisk | None = None
    # Any other disks (a template builder's source, base and output), after the two above.
    extra_disks: tuple[Disk, ...] = ()
    # The network port (network/): a third virtio-serial port for allow_network or
    # expose_ports. Part of the device layout, hence of the snapshot keys.
    net_port: bool = False

    def disks(self) -> tuple[Disk, ...]:
        """The disks after the root, in the order QEMU gets them: the package layer, the
        template, then extra_disks."""
        disks: list[Disk] = []
        if self.layer is not None:
            disks.append(Disk(self.layer.path, self.layer.kind))
        if self.template is not None:
            disks.append(Disk(self.template.path, "template"))
        return (*disks, *self.extra_disks)
