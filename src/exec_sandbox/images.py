"""Locating the guest images (kernel and root file system) built by images/build.sh.

The build writes `manifest.json` into the images directory, naming the content-hashed kernel
and root image it produced last; the hashes become part of every cache key that depends on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import VmPermanentError

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class GuestImages:
    kernel: Path
    rootfs: Path
    kernel_hash: str
    rootfs_hash: str


def load_images(images_dir: Path) -> GuestImages:
    """Read the manifest in images_dir, or raise VmPermanentError saying how to build images."""
    manifest = images_dir / MANIFEST_NAME
    hint = "build them with `make images` in the exec-sandbox source tree"
    try:
        data = json.loads(manifest.read_text())
        images = GuestImages(
            kernel=Path(data["kernel"]),
            rootfs=Path(data["rootfs"]),
            kernel_hash=str(data["kernel_hash"]),
            rootfs_hash=str(data["rootfs_hash"]),
        )
    except FileNotFoundError:
        raise VmPermanentError(f"no guest images in {images_dir}: {hint}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VmPermanentError(f"unreadable image manifest {manifest}: {exc}; {hint}") from None
    for path in (images.kernel, images.rootfs):
        if not path.is_file():
            raise VmPermanentError(f"guest image {path} named in {manifest} is missing: {hint}")
    return images
