"""What decides how one VM is started (`VmSpec`): a pure value, read by the C boundary
(`binding.start_qemu`), the snapshot keys (`snapshots/identity.py`) and provisioning. Who owns
a VM once it runs (`registry.VmRegistry`) is not part of it: it is handed to the launcher."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..images.catalog import GuestImages
from ..packages.layer import PackageLayer
from ..volumes import VolumeClaims
from . import workspace
from .workspace import WORK_BASE_KIND, WORK_DISK_KIND, WorkDisk


@dataclass(frozen=True)
class Disk:
    """A disk after the root (/dev/vdb, ...): a raw image the guest agent finds by its serial
    "sbx-disk-<kind>" (kind: 1..10 lower-case letters, one disk per kind; the C core checks it).
    Read-only unless writable (a builder's output). A qcow2 overlay sits on the disk `backing`
    (1 + its index in the list: a block node with no device of its own); max_bytes bounds how
    large QEMU may make a writable file (0: its size)."""

    path: Path
    kind: str
    writable: bool = False
    qcow2: bool = False
    backing: int = 0
    max_bytes: int = 0


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
    # The work disk (workspace.py; /home/user and /tmp in the guest): its size in MB (0: none,
    # the guest keeps tmpfs: a template builder), part of the machine (snapshots/identity.py),
    # and where new disks are made (the cache's file system). `work`: the disk this VM starts
    # with (a copy of a snapshot's), else GuestVm.spawn makes an empty one.
    disk_mb: int = 0
    disk_dir: Path | None = None
    work: WorkDisk | None = None
    # Volumes (volumes/): the locked images, after every other disk. The VM holds the locks
    # until its QEMU is reaped (GuestVm.close); the kernel command line says where they go.
    volumes: VolumeClaims | None = None

    def disks(self) -> tuple[Disk, ...]:
        """The disks after the root, in the order QEMU gets them: the package layer, the
        template, the work disk (an overlay: its frozen disk just before it), the volumes,
        then extra_disks."""
        disks: list[Disk] = []
        if self.layer is not None:
            disks.append(Disk(self.layer.path, self.layer.kind))
        if self.template is not None:
            disks.append(Disk(self.template.path, "template"))
        if self.work is not None:
            backing = 0
            if self.work.base is not None:
                disks.append(Disk(self.work.base.path, WORK_BASE_KIND))
                backing = len(disks)
            disks.append(
                Disk(
                    self.work.path,
                    WORK_DISK_KIND,
                    writable=True,
                    qcow2=self.work.overlay,
                    backing=backing,
                    max_bytes=self.work.max_bytes,
                )
            )
        if self.volumes is not None:
            disks.extend(
                Disk(Path(p), kind, writable) for kind, p, writable in self.volumes.disks()
            )
        return (*disks, *self.extra_disks)


async def with_work_disk(spec: VmSpec) -> VmSpec:
    """spec with the work disk its VM starts with: the one given (spec.work: a copy made for
    it), else a new empty one when it should have one (spec.disk_mb). The VM owns it from here:
    GuestVm.spawn closes it if QEMU does not start, GuestVm.close() with the VM. A disk given
    to a second VM is a bug (two guests writing one file system), refused."""
    if spec.work is not None:
        if spec.work.claimed or spec.work.closed:
            raise RuntimeError("a work disk was given to a second VM")
        spec.work.claimed = True
        return spec
    if not spec.disk_mb:
        return spec
    if spec.disk_dir is None:
        raise RuntimeError("VmSpec.disk_mb without disk_dir")
    disk = await workspace.new(spec.disk_dir, spec.disk_mb)
    disk.claimed = True
    return replace(spec, work=disk)
