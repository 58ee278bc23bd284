"""The on-disk store of templates (SchedulerConfig's template directory).

```
blobs/<sha256>.erofs     a template's disk image, named by its SHA-256
names/<name>.json        a Template record (its fields), naming a blob by digest
inputs/<key>.json        what a build's inputs (source, steps, copied files) made last time:
                         the Template record of that build, for a cache hit
locks/<key>.lock         flock: one build of the same inputs at a time, across processes
.build-*/                a build in progress (its staging: same filesystem, so publishing is a
                         link, not a copy)
```

A blob is published by link(2) to its final name, which never replaces an existing file: the
bytes under a digest are written once and never rewritten, so a VM holding one open (or about to
open it by path) always sees what the digest says, and two builds of the same digest publish
one blob. Records are replaced whole (a rename). A record is written after its blob, so a record
never names a blob that was not there; a blob evicted under a record takes the record with it.

Eviction keeps the store under a size cap: first the blobs no record names, then, still over
the cap, the least recently used named ones (logged: their templates are gone). "Used" is the
blob's mtime, refreshed on each lookup; a blob used in the last few minutes is never evicted (a
VM may be about to open it by path).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from .._cache_dirs import build_dir, build_lock, write_json_atomically
from .._threads import in_thread
from ..errors import TemplateError
from ..models import Template
from ..validation import validate_template_name

log = logging.getLogger("exec_sandbox")

_EVICT_GRACE_SECONDS = 600.0
_RECORD_MAX_BYTES = 1 << 20
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_INPUTS_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _check_key(key: str) -> str:
    if not _INPUTS_KEY.fullmatch(key):
        raise ValueError(f"not an inputs key: {key!r}")
    return key


def _hex(digest: str) -> str:
    found = _DIGEST.fullmatch(digest)
    if not found:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return found.group(1)


class TemplateStore:
    """The template store of one directory. Every public method is a coroutine; the disk work
    (reading records, linking and removing images of hundreds of MB) runs in executor threads,
    the `_`-prefixed blocking steps."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._verified: set[str] = set()  # digests whose image this process hashed

    def blob_path(self, digest: str) -> Path:
        """Where the image of digest is (or would be)."""
        return self.root / "blobs" / f"{_hex(digest)}.erofs"

    async def verified(self, digest: str) -> Path:
        """The image of digest, its SHA-256 checked once per process before a VM gets it (the
        cache is the user's files, and an image is a guest's whole root); TemplateError when it
        is gone or no longer matches."""
        path = self.blob_path(digest)
        if digest not in self._verified:
            actual = await in_thread(functools.partial(_file_digest, path))
            if actual is None:
                raise TemplateError(f"the template image {digest} is no longer in the cache")
            if actual != digest:
                raise TemplateError(
                    f"the template image {digest} is damaged (its SHA-256 is now {actual}): "
                    "build the template again"
                )
            self._verified.add(digest)
        return path

    async def get(self, name: str) -> Template | None:
        """The template called name, if its record reads and its image is there with the
        recorded size (a damaged record is removed); marks its image used."""
        return await in_thread(functools.partial(self._get, validate_template_name(name)))

    async def get_by_inputs(self, key: str) -> Template | None:
        """The template a build of these inputs made last time (under whatever name), if its
        image is still there: a rebuild can be skipped."""
        return await in_thread(functools.partial(self._by_inputs, _check_key(key)))

    async def list(self) -> builtins.list[Template]:
        """Every template with a readable record and its image, by name."""
        return await in_thread(self._list)

    async def publish(
        self, template: Template, image: Path, inputs_key: str | None = None
    ) -> Template:
        """Move a built image (a file in a build_dir() directory, whose SHA-256 is
        template.digest) into the store, then record template under its name (replacing an
        older record of that name) and under inputs_key; then evict. If the store has that
        digest already, image is dropped and the stored one kept."""
        validate_template_name(template.name)
        _hex(template.digest)
        if inputs_key is not None:
            _check_key(inputs_key)
        return await in_thread(functools.partial(self._publish, template, image, inputs_key))

    async def name(
        self,
        name: str,
        template: Template,
        *,
        memory_mb: int | None = None,
        vcpus: int | None = None,
    ) -> Template:
        """Record a stored template (a cache hit: get_by_inputs) under name, with the resource
        defaults of this build, created now, built in no time. The record written is returned."""
        named = dataclasses.replace(
            template,
            name=validate_template_name(name),
            memory_mb=memory_mb,
            vcpus=vcpus,
            created_at=time.time(),
            build_ms=0,
        )
        return await in_thread(functools.partial(self._record, named, None))

    async def delete(self, name: str) -> bool:
        """Remove the record of name (False: there was none), and its image unless another
        name refers to it."""
        return await in_thread(functools.partial(self._delete, validate_template_name(name)))

    async def evict(self, keep: str | None = None) -> None:
        """Remove images until the store is under its size cap (keep: a digest to spare)."""
        await in_thread(functools.partial(self._evict, keep))

    def build_dir(self) -> contextlib.AbstractAsyncContextManager[Path]:
        """A fresh private directory for one build on the store's file system, removed
        afterwards (what was published was moved out of it); _cache_dirs.build_dir."""
        return build_dir(self.root)

    def build_lock(
        self, key: str, on_wait: Callable[[], None] | None = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the build lock of key (across processes); _cache_dirs.build_lock."""
        return build_lock(self._dir("locks") / f"{_check_key(key)}.lock", on_wait)

    # --- the blocking steps, run in executor threads ---

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def _read_record(self, path: Path) -> Template | None:
        """The Template of a record file whose image is there with its size; None otherwise
        (an unreadable or damaged record is removed, a missing one is just None)."""
        try:
            with open(path, "rb") as f:
                data = f.read(_RECORD_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("template record %s is unreadable (%s)", path.name, exc)
            return None
        try:
            if len(data) > _RECORD_MAX_BYTES:
                raise ValueError("larger than 1 MiB")
            template = _template_from_json(json.loads(data))
            size = self.blob_path(template.digest).stat().st_size
        except FileNotFoundError:
            log.warning("template record %s names an image that is gone: removed", path.name)
            _unlink(path)
            return None
        except (OSError, ValueError, RecursionError, TypeError) as exc:
            log.warning("template record %s is damaged (%s): removed", path.name, exc)
            _unlink(path)
            return None
        if size != template.size_bytes:
            log.warning(
                "template %s: image is %d bytes, its record says %d: removed",
                template.name,
                size,
                template.size_bytes,
            )
            _unlink(path)
            return None
        return template

    def _touch(self, digest: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.blob_path(digest))

    def _get(self, name: str) -> Template | None:
        template = self._read_record(self._dir("names") / f"{name}.json")
        if template is not None:
            self._touch(template.digest)
        return template

    def _by_inputs(self, key: str) -> Template | None:
        template = self._read_record(self._dir("inputs") / f"{key}.json")
        if template is not None:
            self._touch(template.digest)
        return template

    def _list(self) -> builtins.list[Template]:
        found = []
        for path in sorted(self._dir("names").glob("*.json")):
            template = self._read_record(path)
            if template is not None:
                found.append(template)
        return found

    def _publish(self, template: Template, image: Path, inputs_key: str | None) -> Template:
        target = self.blob_path(template.digest)
        self._dir("blobs")
        size = image.stat().st_size
        if size != template.size_bytes:
            raise TemplateError(
                f"template {template.name}: the image is {size} bytes, not {template.size_bytes}"
            )
        os.chmod(image, 0o444)  # nobody writes a published image: not QEMU's user, not ours
        try:
            # link, not rename: it never replaces a published blob (rewriting one under a VM
            # that has it open would change its disk under it).
            os.link(image, target)
        except FileExistsError:
            pass  # the same digest, published by another build: the same bytes
        image.unlink()
        self._touch(template.digest)
        recorded = self._record(template, inputs_key)
        self._evict(keep=template.digest)
        return recorded

    def _record(self, template: Template, inputs_key: str | None) -> Template:
        if not self.blob_path(template.digest).is_file():
            raise TemplateError(f"template {template.name}: its image {template.digest} is gone")
        data = dataclasses.asdict(template)
        previous = self._read_record(self._dir("names") / f"{template.name}.json")
        if inputs_key is not None:
            write_json_atomically(self._dir("inputs") / f"{inputs_key}.json", data)
        write_json_atomically(self._dir("names") / f"{template.name}.json", data)
        if previous is not None and previous.digest != template.digest:
            self._forget_if_unnamed(previous.digest)
        return template

    def _forget_if_unnamed(self, digest: str) -> None:
        """An image lives as long as a name refers to it: the last name gone (deleted, or
        rebuilt into another image), the image and the inputs records leading to it go too. A
        VM running it keeps its open file; a paused session of it can no longer resume."""
        if self._named_digests().get(digest):
            return
        for record in self._records_of(digest):
            _unlink(record)
        self._remove_blob(digest)

    def _delete(self, name: str) -> bool:
        path = self._dir("names") / f"{name}.json"
        template = self._read_record(path)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        if template is not None:
            self._forget_if_unnamed(template.digest)
        return True

    def _named_digests(self) -> dict[str, builtins.list[Path]]:
        """digest -> the name records that name it."""
        named: dict[str, builtins.list[Path]] = {}
        for path in self._dir("names").glob("*.json"):
            try:
                with open(path, "rb") as f:
                    digest = json.loads(f.read(_RECORD_MAX_BYTES))["digest"]
            except (OSError, ValueError, RecursionError, KeyError, TypeError):
                continue
            if isinstance(digest, str):
                named.setdefault(digest, []).append(path)
        return named

    def _records_of(self, digest: str) -> builtins.list[Path]:
        found = []
        for directory in ("names", "inputs"):
            for path in self._dir(directory).glob("*.json"):
                try:
                    with open(path, "rb") as f:
                        if json.loads(f.read(_RECORD_MAX_BYTES)).get("digest") == digest:
                            found.append(path)
                except (OSError, ValueError, RecursionError, AttributeError):
                    continue
        return found

    def _evict(self, keep: str | None = None) -> None:
        named = self._named_digests()
        blobs = []
        for path in self._dir("blobs").glob("*.erofs"):
            try:
                info = path.stat()
            except OSError:
                continue
            digest = f"sha256:{path.stem}"
            # Unnamed blobs sort first, then by last use.
            blobs.append((digest in named, info.st_mtime, info.st_size, digest))
        total = sum(size for _, _, size, _ in blobs)
        now = time.time()
        for is_named, used, size, digest in sorted(blobs):
            if total <= self.max_bytes:
                break
            if digest == keep or now - used < _EVICT_GRACE_SECONDS:
                continue
            if is_named:
                names = [path.stem for path in named[digest]]
                log.warning(
                    "template store over %d MB: removing the least recently used image %s, "
                    "and with it template(s) %s",
                    self.max_bytes >> 20,
                    digest,
                    ", ".join(sorted(names)),
                )
            else:
                log.info(
                    "template store over %d MB: removing unnamed image %s",
                    self.max_bytes >> 20,
                    digest,
                )
            for record in self._records_of(digest):
                _unlink(record)
            self._remove_blob(digest)
            total -= size
        # Inputs records of images that are gone lead nowhere.
        for path in self._dir("inputs").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, AttributeError, KeyError):
                with open(path, "rb") as f:
                    digest = json.loads(f.read(_RECORD_MAX_BYTES))["digest"]
                if not self.blob_path(digest).exists():
                    _unlink(path)

    def _remove_blob(self, digest: str) -> None:
        _unlink(self.blob_path(digest))


def _template_from_json(data: object) -> Template:
    """A Template from a record, every field checked (a record is our own file, but a damaged
    one must not reach the scheduler as something half-valid)."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    names = {f.name for f in dataclasses.fields(Template)}
    if set(data) != names:
        raise ValueError(f"fields {sorted(set(data) ^ names)} differ from a Template's")
    validate_template_name(data["name"])
    _hex(data["digest"])
    for field in ("size_bytes", "build_ms"):
        if isinstance(data[field], bool) or not isinstance(data[field], int) or data[field] < 0:
            raise ValueError(f"{field} is not a count")
    for field in ("memory_mb", "vcpus"):
        value = data[field]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{field} is not an integer")
    for field in ("languages", "env"):
        value = data[field]
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError(f"{field} is not a mapping of strings")
    if not isinstance(data["workdir"], str) or not isinstance(data["source"], str):
        raise ValueError("workdir or source is not a string")
    if not isinstance(data["created_at"], (int, float)) or isinstance(data["created_at"], bool):
        raise ValueError("created_at is not a time")
    return Template(**{**data, "created_at": float(data["created_at"])})


def _file_digest(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        return None
    return "sha256:" + digest.hexdigest()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
