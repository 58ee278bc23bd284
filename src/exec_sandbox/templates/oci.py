"""Importing a container image for a template: skopeo copies it into an OCI layout, then the host
checks that layout before the builder VM unpacks it.

The host trusts neither the image nor skopeo's reading of it: it reads only index.json, the
manifest and the image config (small, bounded JSON) and streams every blob through SHA-256
against its descriptor. It never opens a layer: unpacking (paths, devices, set-uid files,
symlinks) happens in the builder VM, which the host treats as untrusted anyway.

Sources: a registry reference (`docker://...`, or a bare `name:tag` / `name@sha256:...`), a
directory holding an OCI layout (`DIR` or `DIR:tag`), a tar archive (an oci-archive, else a
docker-archive). The registry configuration (registries.conf, auth.json, certificates) is
skopeo's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._threads import in_thread
from ..errors import InputValidationError, TemplateError

Progress = Callable[[str], None]

LAYOUT_DIR = "oci"  # <staging>/oci, the layout the builder VM unpacks
TAG = "sbx"  # the one tag in it
ARCHITECTURE = "amd64"  # the guest's
OS = "linux"

INDEX_MAX_BYTES = 1 << 20
MANIFEST_MAX_BYTES = 4 << 20
CONFIG_MAX_BYTES = 4 << 20
LAYERS_MAX = 256
# The default cap on an image's layers, compressed (what is downloaded and kept on the host).
DEFAULT_MAX_BYTES = 8 << 30
DEFAULT_TIMEOUT_SECONDS = 1800.0

_MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_LAYER_MEDIA_TYPES = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    }
)
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# A registry reference as docker writes it: host[:port]/path[:tag][@sha256:...]. No whitespace,
# no leading '-' (never an option to skopeo).
_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/:@]{0,511}")
_CHUNK = 1 << 20
_STDERR_KEEP = 16 * 1024
_LINE_MAX = 4096
_WATCH_SECONDS = 0.25


@dataclass(frozen=True)
class ImportedImage:
    """An image copied into `layout` (tag "sbx") and checked. source: what was asked for;
    transport: the skopeo source it was read from; size_bytes: its layers' total size,
    compressed (as stored)."""

    layout: Path
    source: str
    transport: str
    manifest_digest: str
    config_digest: str
    layers: int
    size_bytes: int


def skopeo_problem() -> str | None:
    """Why this host cannot import images (None: it can)."""
    if shutil.which("skopeo") is None:
        return (
            "templates from a container image need skopeo on the host: "
            "apt-get install skopeo (it is not needed for templates built from the default image)"
        )
    return None


def skopeo_sources(source: str | Path) -> list[str]:
    """The skopeo source names to try for source, in order."""
    if isinstance(source, Path):
        return _local_sources(source, None)
    if not isinstance(source, str) or not source:
        raise InputValidationError(f"an image is a reference or a path, got {source!r}")
    if source.startswith("docker://"):
        reference = source[len("docker://") :]
        _check_reference(reference, source)
        return [source]
    head = source.rpartition(":")[0]
    if (
        source.startswith(("/", "./", "../", "~"))
        or os.path.exists(source)
        or (head and os.path.isdir(head))  # DIR:tag of a layout in the current directory
    ):
        path, tag = Path(source).expanduser(), None
        if not path.exists() and ":" in source:
            # DIR:tag, a tag of an OCI layout directory
            head, _, tag = source.rpartition(":")
            path = Path(head).expanduser()
        return _local_sources(path, tag)
    _check_reference(source, source)
    return [f"docker://{source}"]


def _check_reference(reference: str, source: str) -> None:
    # user:token@registry/...: credentials would reach logs, errors and the template's record
    # before skopeo refused them. They belong in the host's registry configuration.
    if re.match(r"[^/@]+:[^/@]*@", reference):
        raise InputValidationError(
            "an image reference cannot carry credentials: log in with `skopeo login` (the "
            "host's registry configuration is used, and never enters a VM)"
        )
    if not _REFERENCE.fullmatch(reference):
        raise InputValidationError(
            f"{source!r} is not an image reference (name[:tag] or name@sha256:...) nor an "
            "existing path"
        )


def _local_sources(path: Path, tag: str | None) -> list[str]:
    path = path.absolute()
    if ":" in str(path):
        # skopeo's path:reference syntax cannot name such a path
        raise InputValidationError(f"an image path cannot contain ':': {str(path)!r}")
    if path.is_dir():
        if not (path / "oci-layout").is_file():
            raise InputValidationError(f"{str(path)!r} is a directory but not an OCI layout")
        if tag is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", tag):
            raise InputValidationError(f"{tag!r} is not an image tag")
        return [f"oci:{path}" + (f":{tag}" if tag else "")]
    if tag is not None or not path.is_file():
        raise InputValidationError(f"no image at {str(path)!r}: no such file or directory")
    return [f"oci-archive:{path}", f"docker-archive:{path}"]


async def import_image(
    source: str | Path,
    staging: Path,
    progress: Progress | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> ImportedImage:
    """Copy source into `<staging>/oci` (tag "sbx", amd64/linux chosen from a multi-platform
    image) with skopeo, then check it. progress gets one line per step (skopeo's "Copying blob
    ..." lines among them). Raises TemplateError (and InputValidationError for a source that is
    neither a reference nor a path); on failure or cancellation skopeo is killed and nothing is
    left in staging."""
    problem = skopeo_problem()
    if problem:
        raise TemplateError(problem)
    transports = skopeo_sources(source)
    report = progress or (lambda line: None)
    layout = staging / LAYOUT_DIR
    scratch = staging / ".skopeo-tmp"
    failures: list[str] = []
    try:
        for transport in transports:
            await in_thread(functools.partial(_reset, layout, scratch))
            report(f"importing {transport}")
            try:
                await _skopeo_copy(transport, layout, scratch, report, max_bytes, timeout)
            except _CopyFailed as exc:
                failures.append(exc.message)
                continue
            report("checking the image")
            image = await in_thread(
                functools.partial(check_layout, layout, max_bytes, str(source), transport)
            )
            report(
                f"image {image.manifest_digest}: {image.layers} layers, "
                f"{image.size_bytes / 1e6:.1f} MB"
            )
            return image
        raise TemplateError(f"cannot import {str(source)!r}: " + "; ".join(failures))
    except BaseException:
        await in_thread(functools.partial(shutil.rmtree, layout, ignore_errors=True))
        raise
    finally:
        await in_thread(functools.partial(shutil.rmtree, scratch, ignore_errors=True))


class _CopyFailed(Exception):
    """skopeo could not read this transport (another may work: an archive of the other kind)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _reset(layout: Path, scratch: Path) -> None:
    shutil.rmtree(layout, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True, mode=0o700)


def _skopeo_argv(transport: str, layout: Path, scratch: Path) -> list[str]:
    # Killed with this process, even SIGKILLed: a copy nobody waits for must not go on pulling
    # (with the host's credentials) and filling the disk past the cap no one checks any more.
    setpriv = shutil.which("setpriv")
    argv = [setpriv, "--pdeathsig", "KILL", "skopeo"] if setpriv else ["skopeo"]
    # Newer skopeo reads this variable itself; older ones only take the (hidden) flag.
    registries_conf = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    if registries_conf:
        argv += ["--registries-conf", registries_conf]
    argv += [
        "--tmpdir",
        str(scratch),
        "--override-arch",
        ARCHITECTURE,
        "--override-os",
        OS,
        "copy",
        "--retry-times",
        "2",
        "--",
        transport,
        f"oci:{layout}:{TAG}",
    ]
    return argv


async def _skopeo_copy(
    transport: str,
    layout: Path,
    scratch: Path,
    report: Progress,
    max_bytes: int,
    timeout: float,
) -> None:
    """One `skopeo copy`, its stdout lines to report, killed on timeout, cancellation, or when
    the layout grows past the cap (a registry may serve more than the manifest says)."""
    process = await asyncio.create_subprocess_exec(
        *_skopeo_argv(transport, layout, scratch),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    stderr = bytearray()
    readers = [
        asyncio.ensure_future(_lines(process.stdout, report)),
        asyncio.ensure_future(_tail(process.stderr, stderr)),
    ]
    over_cap = False
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), _WATCH_SECONDS)
                break
            except TimeoutError:
                pass
            if loop.time() > deadline:
                raise TemplateError(f"importing {transport} took more than {timeout:.0f} s")
            # skopeo's scratch counts too: it unpacks an oci-archive and decompresses there.
            used = await in_thread(functools.partial(_tree_bytes, layout))
            used += await in_thread(functools.partial(_tree_bytes, scratch))
            if used > max_bytes:
                over_cap = True
                break
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        await asyncio.gather(*readers, return_exceptions=True)
    if over_cap:
        raise TemplateError(
            f"{transport}: the image is larger than the cap of {max_bytes / 1e6:.0f} MB"
        )
    if process.returncode != 0:
        raise _classify(transport, stderr.decode("utf-8", "replace"))


async def _lines(stream: asyncio.StreamReader, report: Progress) -> None:
    """Forward stream's lines (bounded in length; \\r ends one too: progress bars)."""
    pending = b""
    while chunk := await stream.read(4096):
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        pending = pending[-_LINE_MAX:]
        for line in lines:
            text = line[:_LINE_MAX].decode("utf-8", "replace").strip()
            if text:
                report(text)
    if pending.strip():
        report(pending.decode("utf-8", "replace").strip())


async def _tail(stream: asyncio.StreamReader, keep: bytearray) -> None:
    while chunk := await stream.read(4096):
        keep += chunk
        del keep[:-_STDERR_KEEP]


def _tree_bytes(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _skopeo_message(stderr: str) -> str:
    """The reason in skopeo's last log line (`level=fatal msg="..."`), trimmed."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "skopeo failed without a message"
    found = re.search(r'msg="((?:[^"\\]|\\.)*)"', last)
    message = found.group(1).replace('\\"', '"') if found else last
    return message if len(message) <= 500 else message[:497] + "..."


def _classify(transport: str, stderr: str) -> Exception:
    message = _skopeo_message(stderr)
    lower = message.lower()
    if "digest did not match" in lower:
        expected = re.search(r"expected (sha256:[0-9a-f]{64})", message)
        layer = expected.group(1) if expected else "a blob"
        return TemplateError(
            f"{transport}: layer {layer} does not match its digest: the image is damaged or "
            f"was altered ({message})"
        )
    if "no such host" in lower:
        return TemplateError(f"{transport}: unknown registry host ({message})")
    if "no descriptor found for reference" in lower:
        return TemplateError(f"{transport}: no such tag in the layout ({message})")
    if "manifest unknown" in lower or "name unknown" in lower or "not found" in lower:
        return TemplateError(f"{transport}: no such image or tag in the registry ({message})")
    if "connection refused" in lower or "i/o timeout" in lower or "dial tcp" in lower:
        return TemplateError(f"{transport}: cannot reach the registry ({message})")
    if "unauthorized" in lower or "authentication required" in lower or "denied" in lower:
        return TemplateError(
            f"{transport}: the registry refused access; log in with `skopeo login` ({message})"
        )
    if "no image found in manifest list" in lower or "choosing an image from manifest" in lower:
        return TemplateError(
            f"{transport}: the image has no {OS}/{ARCHITECTURE} variant ({message})"
        )
    if transport.startswith(("oci-archive:", "docker-archive:")):
        return _CopyFailed(f"{transport}: {message}")
    return TemplateError(f"{transport}: {message}")


# --- the checks of the copied layout (blocking: run in a thread) ---


def check_layout(
    layout: Path, max_bytes: int, source: str = "", transport: str = ""
) -> ImportedImage:
    """Check the layout skopeo wrote: one manifest in index.json, tagged "sbx"; an OCI or docker
    v2 schema 2 manifest with a config and at most LAYERS_MAX layers; every blob's size and
    SHA-256 what its descriptor says (streamed); an amd64/linux config; layers within
    max_bytes. Raises TemplateError naming what is wrong."""
    index = _read_json(layout / "index.json", INDEX_MAX_BYTES, "index.json")
    manifests = index.get("manifests")
    if not isinstance(manifests, list) or len(manifests) != 1:
        raise TemplateError("the imported image's index.json does not name exactly one manifest")
    manifest_desc = _descriptor(manifests[0], "the manifest")
    annotations = manifests[0].get("annotations") or {}
    if not isinstance(annotations, dict) or annotations.get(
        "org.opencontainers.image.ref.name"
    ) != (TAG):
        raise TemplateError(f"the imported image's manifest is not tagged {TAG!r}")
    if manifest_desc["mediaType"] not in (_MEDIA_OCI_MANIFEST, _MEDIA_DOCKER_MANIFEST):
        raise TemplateError(
            f"the imported image's manifest is a {manifest_desc['mediaType']!r}, not an image "
            "manifest"
        )
    manifest = _read_blob_json(layout, manifest_desc, MANIFEST_MAX_BYTES, "the manifest")
    if manifest.get("schemaVersion") != 2:
        raise TemplateError("the image's manifest is not schema version 2")
    config_desc = _descriptor(manifest.get("config"), "the image config")
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise TemplateError("the image's manifest has no layer list")
    if len(layers) > LAYERS_MAX:
        raise TemplateError(f"the image has {len(layers)} layers, more than {LAYERS_MAX}")
    descriptors = [
        _descriptor(layer, f"layer {number}") for number, layer in enumerate(layers, start=1)
    ]
    for number, desc in enumerate(descriptors, start=1):
        if desc["mediaType"] not in _LAYER_MEDIA_TYPES:
            raise TemplateError(
                f"layer {number} ({desc['digest']}) is a {desc['mediaType']!r}, not a tar layer"
            )
    total = sum(desc["size"] for desc in descriptors)
    if total > max_bytes:
        raise TemplateError(
            f"the image's layers are {total / 1e6:.1f} MB, more than the cap of "
            f"{max_bytes / 1e6:.1f} MB"
        )
    config = _read_blob_json(layout, config_desc, CONFIG_MAX_BYTES, "the image config")
    architecture, system = config.get("architecture"), config.get("os")
    if architecture != ARCHITECTURE or system != OS:
        raise TemplateError(
            f"the image is for {system}/{architecture}; the sandbox runs {OS}/{ARCHITECTURE}"
        )
    for number, desc in enumerate(descriptors, start=1):
        _verify_blob(layout, desc, f"layer {number} of {len(descriptors)} ({desc['digest']})")
    return ImportedImage(
        layout=layout,
        source=source,
        transport=transport,
        manifest_digest=manifest_desc["digest"],
        config_digest=config_desc["digest"],
        layers=len(descriptors),
        size_bytes=total,
    )


def _read_json(path: Path, limit: int, what: str) -> dict[str, Any]:
    data = _read_bounded(path, limit, what)
    return _parse_json(data, what)


def _parse_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # nesting deep enough blows the parser's stack
        raise TemplateError(f"the image's {what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise TemplateError(f"the image's {what} is not a JSON object")
    return value


def _descriptor(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TemplateError(f"the image's descriptor of {what} is not a JSON object")
    digest, size, media = value.get("digest"), value.get("size"), value.get("mediaType")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise TemplateError(f"{what}'s digest {digest!r} is not a sha256 digest")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise TemplateError(f"{what}'s size {size!r} is not a byte count")
    if not isinstance(media, str):
        raise TemplateError(f"{what} has no media type")
    return {"digest": digest, "size": size, "mediaType": media}


def _open_blob(layout: Path, desc: dict[str, Any], what: str) -> int:
    path = layout / "blobs" / "sha256" / desc["digest"][len("sha256:") :]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TemplateError(f"{what} is missing from the imported image: {exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != desc["size"]:
        os.close(fd)
        raise TemplateError(
            f"{what} is {info.st_size} bytes, its descriptor says {desc['size']}: the image is "
            "damaged or was altered"
        )
    return fd


def _read_blob_json(layout: Path, desc: dict[str, Any], limit: int, what: str) -> dict[str, Any]:
    if desc["size"] > limit:
        raise TemplateError(f"{what} is {desc['size']} bytes, more than {limit}")
    fd = _open_blob(layout, desc, what)
    try:
        data = _read_fd(fd, limit)
    finally:
        os.close(fd)
    if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"]:
        raise TemplateError(f"{what} does not match its digest {desc['digest']}")
    return _parse_json(data, what)


def _verify_blob(layout: Path, desc: dict[str, Any], what: str) -> None:
    fd = _open_blob(layout, desc, what)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    if "sha256:" + digest.hexdigest() != desc["digest"]:
        raise TemplateError(
            f"{what} does not match its digest: the image is damaged or was altered"
        )


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TemplateError(f"the imported image has no readable {what}: {exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TemplateError(f"the imported image's {what} is not a file")
        data = _read_fd(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TemplateError(f"the imported image's {what} is larger than {limit} bytes")
    return data


def _read_fd(fd: int, limit: int) -> bytes:
    parts = []
    remaining = limit
    while remaining > 0 and (chunk := os.read(fd, min(_CHUNK, remaining))):
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)
