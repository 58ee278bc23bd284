"""Packing a package tree into a read-only EROFS image, the disk a VM mounts its layer from."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from ..errors import PackageBuildError
from .tools import require_tool, run_tool

MKFS_TIMEOUT_SECONDS = 300.0
# Stable, so that the same tree gives the same bytes (no random UUID in the superblock).
_UUID = "6f2c8a1e-5b7d-4e43-9a0c-2d1f3e4b5a69"


def normalize_tree(tree: Path) -> None:
    """Modes that uid 1000 in the guest can read and run whatever umask the host had: directories
    0755, files 0755 when anyone could execute them, else 0644. Nothing set-uid, nothing
    writable by others. Symlinks that leave the tree are dropped (a wheel or npm tarball should
    have none; the guest would resolve them against its own root)."""
    root = tree.resolve()
    for dirpath, dirnames, filenames in os.walk(tree):
        os.chmod(dirpath, 0o755)
        for name in filenames + dirnames:
            path = Path(dirpath, name)
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                target = (path.parent / os.readlink(path)).resolve()
                if not target.is_relative_to(root):
                    path.unlink()
            elif stat.S_ISREG(info.st_mode):
                path.chmod(0o755 if info.st_mode & 0o111 else 0o644)
            elif not stat.S_ISDIR(info.st_mode):
                path.unlink()  # devices, fifos, sockets: never part of a package


async def pack(tree: Path, image: Path, *, normalize: bool = True) -> int:
    """mkfs.erofs over tree: files owned by root, timestamps zeroed, no extended attributes.
    Returns the image's size. normalize: normalize_tree() first (a template build's sources
    keep their modes and links: they are copied as they are, like a Dockerfile's COPY)."""
    mkfs = require_tool("mkfs.erofs", "erofs-utils")
    if normalize:
        await asyncio.get_running_loop().run_in_executor(None, normalize_tree, tree)
    result = await run_tool(
        [mkfs, "--quiet", "-T0", "--all-root", "-x-1", f"-U{_UUID}", str(image), str(tree)],
        timeout=MKFS_TIMEOUT_SECONDS,
        what="mkfs.erofs",
    )
    if result.returncode != 0:
        raise PackageBuildError(f"mkfs.erofs failed: {result.tail()}")
    return image.stat().st_size
