"""Packing an installed package tree into the tar archive that an install into a running VM
unpacks (installs.py; the guest's side is exec_sandbox_guest/_install.py).

A running VM cannot take another disk (no hot-plug on the microvm machine), so packages added
to it travel as one file over the agent channel into the home directory, and the guest's pip
unpacks them into the user site directory on its work disk. The same tree gives the same bytes:
entries sorted, owners and timestamps zeroed, modes normalized (erofs.normalize_tree).
"""

from __future__ import annotations

import asyncio
import os
import tarfile
from pathlib import Path

from .erofs import normalize_tree

# pip --target puts console scripts in bin/ beside the packages; the guest puts them in
# ~/.local/bin and everything else into the site directory. A javascript tree is one
# node_modules directory.
SITE_PREFIX = "site-packages"
BIN_PREFIX = "bin"
NODE_PREFIX = "node_modules"


async def pack(tree: Path, archive: Path, *, javascript: bool = False) -> int:
    """Write archive from tree; returns its size."""
    await asyncio.get_running_loop().run_in_executor(None, _pack, tree, archive, javascript)
    return archive.stat().st_size


def _pack(tree: Path, archive: Path, javascript: bool) -> None:
    normalize_tree(tree)
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(tree):
            dirnames.sort()
            relative = Path(dirpath).relative_to(tree)
            for name in sorted(filenames):
                path = Path(dirpath, name)
                if path.is_symlink() or not path.is_file():
                    continue  # links inside the tree: the guest takes files only
                parts = (relative / name).parts
                if javascript:
                    prefix, rest = NODE_PREFIX, parts
                elif parts[0] == "bin" and len(parts) > 1:
                    prefix, rest = BIN_PREFIX, parts[1:]
                else:
                    prefix, rest = SITE_PREFIX, parts
                info = tar.gettarinfo(str(path), "/".join((prefix, *rest)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                with path.open("rb") as f:
                    tar.addfile(info, f)
