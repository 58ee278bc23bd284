"""A JSON file of the server's state directory, written whole and private: a reader (another
`sbx token` command, the server after a restart) sees the old content or the new, never half of
it, and nobody but the owner can read it (it holds token hashes and who owns what)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

# Bigger than any honest state file (a record is ~200 bytes): refuse, rather than parse, one
# that something else grew.
MAX_BYTES = 16 << 20


def read_json(path: Path) -> Any:
    """The file's JSON, None when there is none. ValueError for a damaged or oversized one."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path} is larger than {MAX_BYTES} bytes")
    return json.loads(data)


def set_aside(path: Path) -> Path:
    """Rename a damaged file out of the way (PATH.damaged-TIME), kept for whoever looks into
    it, so that the next write starts afresh without destroying the evidence."""
    target = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    n = 1
    while target.exists():
        target = target.with_name(f"{target.name.split('~')[0]}~{n}")
        n += 1
    os.replace(path, target)
    return target


def write_json(path: Path, value: Any) -> None:
    """Replace the file atomically with value, mode 0600, in a 0700 directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp made it 0600
            json.dump(value, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is replaced or edited (inode, size, mtime), None if absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
