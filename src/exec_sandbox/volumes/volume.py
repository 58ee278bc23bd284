"""What a volume is to the caller (`Volume`, `VolumeMount`) and the checks of what it names: the
volume's name, its size and the guest path it is mounted at. Pure: no I/O (store.py has that).

A volume is a raw disk image on the host that the guest formats (ext4) and mounts: the host
creates it empty and never reads what the guest wrote (docs/design.md, "Volumes"). It is
read-write in one VM at a time or read-only in any number of them (store.py's locks).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import InputValidationError

# [a-z0-9][a-z0-9_.-]{0,62}: a file name on every host file system, and no "." or ".." of its own.
VOLUME_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
MIN_VOLUME_MB = 16  # ext4 with a journal needs a few MB of its own
MAX_VOLUME_MB = 1024 * 1024  # 1 TiB, sparse: costs nothing until written
# Volumes one VM may have: the disks "vola".."volc" (the C core's SBX_VM_DISKS_MAX leaves room
# for them beside the workspace and a package layer or a template).
MAX_VOLUMES = 3
VOLUME_KINDS = ("vola", "volb", "volc")
# The mount path travels on the kernel command line (2047 bytes in all) and is made inside a
# template's root by the agent (guest/src/volumes.c has the same bound).
MAX_MOUNT_PATH = 100
_MOUNT_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+")
# Where a volume may not go: the guest's system (read-only image, the agent's own mounts), and
# the home itself (a volume goes below it, beside the user's files).
_FORBIDDEN_TOP = frozenset(
    {
        "proc",
        "sys",
        "dev",
        "run",
        "usr",
        "etc",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "boot",
        "root",
        "var",
        "tmp",
    }
)


@dataclass(frozen=True)
class Volume:
    """A named volume of this host (`Scheduler.volume()`, `sbx volume create`).

    name: [a-z0-9][a-z0-9_.-]{0,62}; size_mb: the disk's size (sparse on the host: only what
    the guest wrote takes room); created_at: time.time() of its creation. Attach it with
    `volumes={"/mnt/data": volume}` (read-write) or `{"/mnt/data": volume.read_only()}`."""

    name: str
    size_mb: int
    created_at: float = 0.0

    def read_only(self) -> VolumeMount:
        """This volume mounted read-only (any number of VMs at once)."""
        return VolumeMount(self.name, read_only=True)


@dataclass(frozen=True)
class VolumeMount:
    """How one volume is attached: by name (or a Volume), read-write unless read_only. A
    read-write attach needs the volume alone; read-only ones share it with each other."""

    volume: str | Volume
    read_only: bool = False

    @property
    def name(self) -> str:
        return self.volume.name if isinstance(self.volume, Volume) else self.volume


@dataclass(frozen=True)
class VolumeAttach:
    """One validated entry of `volumes=`: mount path in the guest, volume name, mode. Plain
    values, so a RunRequest that carries them still pickles."""

    path: str
    name: str
    read_only: bool


def validate_volume_name(name: object) -> str:
    if not isinstance(name, str) or not VOLUME_NAME.fullmatch(name):
        raise InputValidationError(
            f"a volume name is 1-63 of a-z, 0-9, '.', '_', '-' (starting with a letter or "
            f"digit), got {name!r}"
        )
    return name


def validate_volume_size(size_mb: object) -> int:
    if isinstance(size_mb, bool) or not isinstance(size_mb, int):
        raise InputValidationError(f"size_mb must be an int, got {type(size_mb).__name__}")
    if not MIN_VOLUME_MB <= size_mb <= MAX_VOLUME_MB:
        raise InputValidationError(
            f"size_mb must be {MIN_VOLUME_MB}..{MAX_VOLUME_MB}, got {size_mb}"
        )
    return size_mb


def validate_mount_path(path: object) -> str:
    """An absolute guest path of [A-Za-z0-9._-] components, at least two deep (the top level
    of the guest's read-only image cannot take new directories), none "." or "..", outside the
    guest's system directories, and not /home/user itself."""
    if not isinstance(path, str):
        raise InputValidationError(f"a volume mount path must be a str, got {type(path).__name__}")
    parts = path.split("/")[1:]
    problem = None
    if not _MOUNT_PATH.fullmatch(path) or len(path) > MAX_MOUNT_PATH:
        problem = f"an absolute path of [A-Za-z0-9._-] components, at most {MAX_MOUNT_PATH} bytes"
    elif any(part in (".", "..") for part in parts):
        problem = "a path without '.' or '..' components"
    elif len(parts) < 2:
        problem = "at least two components deep (e.g. /mnt/data)"
    elif parts[0] in _FORBIDDEN_TOP:
        problem = f"outside /{parts[0]} (the guest's own)"
    elif parts[0] == "home" and (parts[1] != "user" or len(parts) < 3):
        problem = "below /home/user, not /home/user itself or another home"
    if problem is not None:
        raise InputValidationError(f"volume mount path {path!r}: must be {problem}")
    return path


def validate_volumes(volumes: object) -> tuple[VolumeAttach, ...]:
    """`volumes=` of run()/session(): {mount path: Volume | name | VolumeMount}. Paths must not
    nest (one mount would hide the other), a volume is named once (a VM cannot hold its own lock
    twice), at most MAX_VOLUMES."""
    if volumes is None:
        return ()
    if not isinstance(volumes, Mapping):
        raise InputValidationError(
            f"volumes must be a mapping of mount path to volume, got {type(volumes).__name__}"
        )
    if len(volumes) > MAX_VOLUMES:
        raise InputValidationError(f"at most {MAX_VOLUMES} volumes per VM, got {len(volumes)}")
    attaches: list[VolumeAttach] = []
    for path, what in volumes.items():
        path = validate_mount_path(path)
        if isinstance(what, VolumeMount):
            name, read_only = what.name, what.read_only
            if not isinstance(read_only, bool):
                raise InputValidationError("VolumeMount.read_only must be a bool")
        elif isinstance(what, Volume):
            name, read_only = what.name, False
        else:
            name, read_only = what, False
        name = validate_volume_name(name)
        for other in attaches:
            if other.name == name:
                raise InputValidationError(f"volume {name!r} is mounted twice")
            if (path + "/").startswith(other.path + "/") or (other.path + "/").startswith(
                path + "/"
            ):
                raise InputValidationError(f"volume mount paths {other.path!r} and {path!r} nest")
        attaches.append(VolumeAttach(path, name, read_only))
    return tuple(attaches)


def parse_volume_option(text: str) -> tuple[str, VolumeMount]:
    """The CLI's `--volume /mnt/data=NAME[:ro|:rw]` as (mount path, VolumeMount)."""
    path, sep, rest = text.partition("=")
    if not sep or not rest:
        raise InputValidationError(f"--volume takes PATH=NAME[:ro], got {text!r}")
    name, _, mode = rest.partition(":")
    if mode not in ("", "ro", "rw"):
        raise InputValidationError(f"--volume mode must be ro or rw, got {mode!r}")
    return validate_mount_path(path), VolumeMount(validate_volume_name(name), mode == "ro")


def kernel_cmdline(attaches: tuple[VolumeAttach, ...]) -> str:
    """What tells the guest agent where each volume disk goes: `sbx.<kind>=<rw|ro>:<path>`, one
    word per volume, in the order of VOLUME_KINDS (guest/src/volumes.c parses it). The kernel
    passes dotted words to no one but /proc/cmdline."""
    return " ".join(
        f"sbx.{kind}={'ro' if a.read_only else 'rw'}:{a.path}"
        for kind, a in zip(VOLUME_KINDS, attaches, strict=False)
    )
