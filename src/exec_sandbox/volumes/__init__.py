"""Volumes: named disks of this host that outlive VMs (docs/design.md, "Volumes")."""

from .store import VolumeClaims, VolumeStore
from .volume import (
    MAX_VOLUMES,
    VOLUME_KINDS,
    Volume,
    VolumeAttach,
    VolumeMount,
    kernel_cmdline,
    parse_volume_option,
    validate_mount_path,
    validate_volume_name,
    validate_volume_size,
    validate_volumes,
)

__all__ = [
    "MAX_VOLUMES",
    "VOLUME_KINDS",
    "Volume",
    "VolumeAttach",
    "VolumeClaims",
    "VolumeMount",
    "VolumeStore",
    "kernel_cmdline",
    "parse_volume_option",
    "validate_mount_path",
    "validate_volume_name",
    "validate_volume_size",
    "validate_volumes",
]
