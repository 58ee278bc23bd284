"""Content digests of files the library wrote (caches, snapshots)."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, hex (blocking: run it in a thread for large files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
