"""Content digests of files the library wrote (caches, snapshots)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, hex (blocking: run it in a thread for large files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fd_sha256(fd: int) -> str:
    """SHA-256 of an open file's bytes from offset 0, read without moving its offset."""
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()
