"""Importing a container image for a template (no VM): skopeo copies it from a layout directory,
an archive or a loopback registry into an OCI layout, and the host checks that layout (bounded
JSON, every blob's digest, the architecture, the size cap) without opening a layer."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from exec_sandbox import InputValidationError, TemplateError
from exec_sandbox.templates.oci import (
    LAYOUT_DIR,
    TAG,
    check_layout,
    import_image,
    skopeo_sources,
)
from tests.helpers import processes
from tests.templates_support import (
    BusyboxImage,
    Registry,
    flip_a_byte,
    free_port,
    layer_blobs,
    make_foreign_layout,
    make_hostile_layout,
)


def _layer_digests(layout: Path, tag: str) -> list[str]:
    return [f"sha256:{blob.name}" for blob in layer_blobs(layout, tag)]


def _skopeo_children() -> list[int]:
    return processes("skopeo", os.getpid())


async def test_import_from_a_layout_directory(busybox_image: BusyboxImage, tmp_path: Path) -> None:
    lines: list[str] = []
    image = await import_image(busybox_image.layout, tmp_path, lines.append)
    assert image.layout == tmp_path / LAYOUT_DIR
    assert image.transport == f"oci:{busybox_image.layout}"
    assert image.manifest_digest == busybox_image.manifest_digest
    assert image.layers == 1
    assert image.size_bytes == sum(p.stat().st_size for p in layer_blobs(image.layout, TAG))
    assert image.config_digest.startswith("sha256:")
    assert any(line.startswith("Copying blob") for line in lines), lines
    # skopeo's scratch space is gone; only the layout is left
    assert sorted(p.name for p in tmp_path.iterdir()) == [LAYOUT_DIR]


async def test_import_of_a_named_tag_of_a_layout(
    busybox_image: BusyboxImage, tmp_path: Path
) -> None:
    image = await import_image(f"{busybox_image.layout}:1", tmp_path)
    assert image.manifest_digest == busybox_image.manifest_digest


async def test_import_of_a_missing_tag_of_a_layout(
    busybox_image: BusyboxImage, tmp_path: Path
) -> None:
    with pytest.raises(TemplateError, match="no such tag in the layout .*nope"):
        await import_image(f"{busybox_image.layout}:nope", tmp_path)
    assert list(tmp_path.iterdir()) == []


async def test_import_from_an_oci_archive(busybox_image: BusyboxImage, tmp_path: Path) -> None:
    image = await import_image(busybox_image.oci_archive, tmp_path)
    assert image.transport == f"oci-archive:{busybox_image.oci_archive}"
    assert image.manifest_digest == busybox_image.manifest_digest


async def test_import_from_a_docker_archive(busybox_image: BusyboxImage, tmp_path: Path) -> None:
    image = await import_image(str(busybox_image.docker_archive), tmp_path)
    # the oci-archive reading failed first; the docker-archive one worked
    assert image.transport == f"docker-archive:{busybox_image.docker_archive}"
    assert image.layers == 1


async def test_import_from_a_registry_by_tag(registry: Registry, tmp_path: Path) -> None:
    lines: list[str] = []
    image = await import_image(registry.reference, tmp_path, lines.append)
    assert image.transport == f"docker://{registry.reference}"
    assert image.layers == 1
    assert lines[0] == f"importing docker://{registry.reference}"


async def test_import_from_a_registry_by_digest(registry: Registry, tmp_path: Path) -> None:
    image = await import_image(f"docker://{registry.by_digest}", tmp_path)
    assert image.transport == f"docker://{registry.by_digest}"
    assert image.layers == 1


async def test_a_missing_tag_in_the_registry_is_named(registry: Registry, tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="no such image or tag"):
        await import_image(f"{registry.host}/test/busybox:missing", tmp_path)
    assert list(tmp_path.iterdir()) == []


async def test_an_unreachable_registry_is_named(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot reach the registry"):
        await import_image(f"127.0.0.1:{free_port()}/test/busybox:1", tmp_path)
    assert list(tmp_path.iterdir()) == []


async def test_a_tampered_layer_is_refused_naming_it(
    busybox_image: BusyboxImage, tmp_path: Path
) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(busybox_image.layout, tampered)
    (layer,) = layer_blobs(tampered)
    flip_a_byte(layer)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(TemplateError, match=f"layer sha256:{layer.name} does not match"):
        await import_image(tampered, staging)
    assert list(staging.iterdir()) == []


def test_the_host_check_finds_a_layer_tampered_after_the_copy(
    busybox_image: BusyboxImage, tmp_path: Path
) -> None:
    layout = tmp_path / "layout"
    shutil.copytree(busybox_image.layout, layout)
    # check_layout reads the tag "sbx"; the fixture's is "1"
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] = TAG
    (layout / "index.json").write_text(json.dumps(index))
    check_layout(layout, 1 << 30)
    (layer,) = layer_blobs(layout, TAG)
    flip_a_byte(layer)
    with pytest.raises(TemplateError, match=f"layer 1 of 1 \\(sha256:{layer.name}\\) does not"):
        check_layout(layout, 1 << 30)


async def test_another_architecture_is_refused(tmp_path: Path) -> None:
    foreign = make_foreign_layout(tmp_path / "arm64")
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(TemplateError, match="linux/arm64; the sandbox runs linux/amd64"):
        await import_image(foreign, staging)
    assert list(staging.iterdir()) == []


async def test_an_image_over_the_cap_is_refused(
    busybox_image: BusyboxImage, tmp_path: Path
) -> None:
    with pytest.raises(TemplateError, match="cap of"):
        await import_image(busybox_image.layout, tmp_path, max_bytes=100_000)
    assert list(tmp_path.iterdir()) == []


async def test_hostile_layer_content_imports_without_the_host_opening_it(tmp_path: Path) -> None:
    # ../ paths, a device node, a set-uid file, symlinks out of the tree: the host only hashes
    # the layer; judging its entries is the builder VM's business.
    hostile = make_hostile_layout(tmp_path / "hostile")
    staging = tmp_path / "staging"
    staging.mkdir()
    image = await import_image(hostile, staging)
    assert image.layers == 2
    assert _layer_digests(hostile, "1") == _layer_digests(image.layout, TAG)
    assert not (tmp_path / "escaped-by-dotdot").exists()


async def test_a_hung_registry_is_killed_on_cancellation(tmp_path: Path) -> None:
    # A listener that never answers: skopeo hangs in the TLS handshake.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        task = asyncio.ensure_future(import_image(f"127.0.0.1:{port}/hung/image:1", tmp_path))
        deadline = time.monotonic() + 10
        while not _skopeo_children() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _skopeo_children(), "skopeo never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _skopeo_children() == []
    assert list(tmp_path.iterdir()) == []


async def test_a_hung_registry_times_out(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        with pytest.raises(TemplateError, match="took more than 1 s"):
            await import_image(f"127.0.0.1:{port}/hung/image:1", tmp_path, timeout=1.0)
    assert _skopeo_children() == []
    assert list(tmp_path.iterdir()) == []


async def test_a_host_without_skopeo_is_told_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TemplateError, match="apt-get install skopeo"):
        await import_image("alpine:3.20", tmp_path)


def test_sources_are_read_as_references_or_paths(busybox_image: BusyboxImage) -> None:
    assert skopeo_sources("alpine:3.20") == ["docker://alpine:3.20"]
    assert skopeo_sources("registry.example/o/r@sha256:" + "a" * 64) == [
        "docker://registry.example/o/r@sha256:" + "a" * 64
    ]
    assert skopeo_sources("docker://alpine") == ["docker://alpine"]
    assert skopeo_sources(busybox_image.layout) == [f"oci:{busybox_image.layout}"]
    archive = busybox_image.oci_archive
    assert skopeo_sources(archive) == [f"oci-archive:{archive}", f"docker-archive:{archive}"]


@pytest.mark.parametrize("source", ["-v", "alpine latest", "", "/no/such/dir", "./missing.tar"])
def test_sources_that_are_neither_are_refused(source: str) -> None:
    with pytest.raises(InputValidationError):
        skopeo_sources(source)


def test_a_directory_that_is_not_a_layout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputValidationError, match="not an OCI layout"):
        skopeo_sources(tmp_path)


def test_a_reference_carrying_credentials_is_refused() -> None:
    with pytest.raises(InputValidationError, match="credentials"):
        skopeo_sources("user:token@registry.example/team/image:1")
    assert skopeo_sources("registry.example:5000/team/image:1") == [
        "docker://registry.example:5000/team/image:1"
    ]
