"""Batched file transfers for `ExecSandboxBackend`: many files per guest round trip.

An upload packs its files into one blob (a JSON manifest, then the contents back to back) sent
with one file transfer; one `python3` run in the guest puts each file in place and reports one
JSON line per file. A download is the reverse: one run copies the readable files into one blob
and reports a line per path, one file transfer brings the blob back, one command removes it. So
a batch costs two or three round trips whatever its file count (it was two or three per file).

Batches are bounded in bytes (`BATCH_BYTES`, a file larger than that travels alone) because the
blob is staged in the guest home, a tmpfs sized from the VM's RAM. The guest's report is read as
untrusted: a line that is not what the script prints becomes an error for that path.
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Iterator, Sequence

BATCH_BYTES = 64 * 1024 * 1024
# Paths of a download batch travel in one argv string (Linux caps one at 128 KiB).
_BATCH_PATH_BYTES = 60 * 1024

# python3 -c UPLOAD_SCRIPT BLOB: the blob is "<manifest length>\n<manifest>" then the contents;
# the manifest is [[path, size], ...]. Prints one JSON line per file: null, or an error name.
UPLOAD_SCRIPT = r"""
import errno, json, os, sys
def name(e):
    if isinstance(e, PermissionError) or e.errno == errno.EROFS:
        return "permission_denied"
    if isinstance(e, IsADirectoryError):
        return "is_directory"
    if isinstance(e, (FileNotFoundError, NotADirectoryError, FileExistsError)):
        return "invalid_path"
    return (e.strerror or str(e))[:200]
blob = sys.argv[1]
try:
    with open(blob, "rb") as f:
        manifest = json.loads(f.read(int(f.readline())))
        offset = f.tell()
        for path, size in manifest:
            try:
                parent = os.path.dirname(path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                f.seek(offset)
                with open(path, "wb") as out:
                    left = size
                    while left:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            raise OSError(errno.EIO, "the staged upload is short")
                        out.write(chunk)
                        left -= len(chunk)
                print(json.dumps(None))
            except OSError as e:
                print(json.dumps(name(e)))
            offset += size
finally:
    os.remove(blob)
"""

# python3 -c DOWNLOAD_SCRIPT BLOB CAP PATHS_B64: copies each readable file into BLOB, stopping
# (reporting {"defer": true}) once CAP bytes are in it. One JSON line per path: {"size": n} or
# {"error": name} or {"defer": true}.
DOWNLOAD_SCRIPT = r"""
import base64, json, os, sys
blob, cap = sys.argv[1], int(sys.argv[2])
paths = json.loads(base64.b64decode(sys.argv[3]))
total, copied = 0, 0
with open(blob, "wb") as out:
    for path in paths:
        if copied and total >= cap:
            print(json.dumps({"defer": True}))
            continue
        start = out.tell()
        try:
            with open(path, "rb") as f:
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
            size = out.tell() - start
            total, copied = total + size, copied + 1
            print(json.dumps({"size": size}))
        except OSError as e:
            out.seek(start)
            out.truncate()
            if isinstance(e, IsADirectoryError):
                error = "is_directory"
            elif isinstance(e, (FileNotFoundError, NotADirectoryError)):
                error = "file_not_found"
            elif isinstance(e, PermissionError):
                error = "permission_denied"
            else:
                error = (e.strerror or str(e))[:200]
            print(json.dumps({"error": error}))
"""


def upload_batches(
    files: Sequence[tuple[int, str, bytes]],
) -> Iterator[list[tuple[int, str, bytes]]]:
    """(index, path, content) in order, cut into batches of at most BATCH_BYTES of content."""
    batch: list[tuple[int, str, bytes]] = []
    size = 0
    for item in files:
        if batch and size + len(item[2]) > BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item[2])
    if batch:
        yield batch


def upload_blob(batch: Sequence[tuple[int, str, bytes]]) -> bytes:
    manifest = json.dumps([[path, len(content)] for _, path, content in batch]).encode()
    return b"".join([str(len(manifest)).encode(), b"\n", manifest, *(c for _, _, c in batch)])


def upload_command(staged: str) -> str:
    return f"python3 -c {shlex.quote(UPLOAD_SCRIPT)} ~/{shlex.quote(staged)}"


def parse_upload_report(output: str, count: int) -> list[str | None]:
    """One error (None = written) per file of the batch; a missing or malformed line is an
    error for its file."""
    errors: list[str | None] = []
    for line in output.splitlines()[:count]:
        try:
            value = json.loads(line)
        except ValueError:
            value = "unknown error"
        errors.append(value if value is None or _is_error_name(value) else "unknown error")
    errors += ["the sandbox did not report this file"] * (count - len(errors))
    return errors


def path_batches(paths: Sequence[tuple[int, str]]) -> Iterator[list[tuple[int, str]]]:
    """(index, path) in order, cut so that one batch's paths fit in one argv string."""
    batch: list[tuple[int, str]] = []
    size = 0
    for item in paths:
        cost = len(item[1].encode()) + 4
        if batch and size + cost > _BATCH_PATH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += cost
    if batch:
        yield batch


def download_command(staged: str, paths: Sequence[str]) -> str:
    encoded = base64.b64encode(json.dumps(list(paths)).encode()).decode()
    return (
        f"python3 -c {shlex.quote(DOWNLOAD_SCRIPT)} ~/{shlex.quote(staged)} {BATCH_BYTES} {encoded}"
    )


# What parse_download_report gives per path: content size, an error name, or None (deferred to
# the next batch).
DownloadEntry = int | str | None


def parse_download_report(output: str, count: int) -> list[DownloadEntry]:
    entries: list[DownloadEntry] = []
    for line in output.splitlines()[:count]:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            entries.append("unknown error")
        elif record.get("defer") is True:
            entries.append(None)
        elif _is_size(record.get("size")):
            entries.append(record["size"])
        elif _is_error_name(record.get("error")):
            entries.append(record["error"])
        else:
            entries.append("unknown error")
    entries += ["the sandbox did not report this file"] * (count - len(entries))
    return entries


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_error_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200
