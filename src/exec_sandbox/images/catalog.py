"""Locating the guest images (kernel and root file system) built by `sbx setup` (images/build.sh).

The build writes `manifest.json` into the images directory, naming the content-hashed kernel
and root image it produced last; the hashes become part of every cache key that depends on them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import VmPermanentError

MANIFEST_NAME = "manifest.json"
# The one command that builds (or repairs) the images: every "no images" message names it.
SETUP_COMMAND = "sbx setup"


@dataclass(frozen=True)
class GuestFacts:
    """What the root image holds that host-built package layers must match (images/rootfs/
    finish-image.sh writes them at build time): the python version ("3.13"), glibc ("2.41"),
    and the hash of its package tree (changes when the image's packages do, not when only the
    agent does); node's version ("22.20.0", "" for images that did not record it) and whether
    that node has node's built-in startup snapshot (then no user-land one is built for it:
    snapshots/node_startup.py)."""

    python: str
    glibc: str
    tree: str
    node: str = ""
    node_snapshot: bool = False


@dataclass(frozen=True)
class GuestImages:
    kernel: Path
    rootfs: Path
    kernel_hash: str
    rootfs_hash: str
    guest: GuestFacts | None = None  # None: images built before the facts were recorded


def load_images(images_dir: Path) -> GuestImages:
    """Read the manifest in images_dir, or raise VmPermanentError saying how to build images."""
    manifest = images_dir / MANIFEST_NAME
    hint = f"run `{SETUP_COMMAND}` to build them"
    try:
        data = json.loads(manifest.read_text())
        images = GuestImages(
            kernel=Path(data["kernel"]),
            rootfs=Path(data["rootfs"]),
            kernel_hash=str(data["kernel_hash"]),
            rootfs_hash=str(data["rootfs_hash"]),
            guest=_facts(data.get("guest")),
        )
    except FileNotFoundError:
        raise VmPermanentError(f"no guest images in {images_dir}: {hint}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VmPermanentError(f"unreadable image manifest {manifest}: {exc}; {hint}") from None
    for path in (images.kernel, images.rootfs):
        if not path.is_file():
            raise VmPermanentError(f"guest image {path} named in {manifest} is missing: {hint}")
    return images


def _facts(data: object) -> GuestFacts | None:
    if not isinstance(data, dict):
        return None
    values = [data.get(name) for name in ("python", "glibc", "tree")]
    if not all(isinstance(v, str) and re.fullmatch(r"[0-9a-f.]{1,64}", v) for v in values):
        return None
    python, glibc, tree = (str(v) for v in values)
    node = data.get("node")
    node_snapshot = data.get("node_snapshot")
    return GuestFacts(
        python=python,
        glibc=glibc,
        tree=tree,
        node=node if isinstance(node, str) and re.fullmatch(r"[0-9.]{1,32}", node) else "",
        node_snapshot=node_snapshot is True,
    )
