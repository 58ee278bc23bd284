"""The template store (no VM): images published by digest and never rewritten, records by name
and by build inputs, LRU eviction under a size cap (unnamed images first), delete, concurrent
publishing of one digest, and nothing half-written after a failure."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import pytest

from exec_sandbox import InputValidationError, Template, TemplateError
from exec_sandbox.templates.store import TemplateStore

OLD = time.time() - 3600  # older than the eviction grace


def _template(name: str, data: bytes, **fields: object) -> Template:
    values: dict[str, object] = {
        "name": name,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "languages": {"python": "3.12.1", "raw": "sh"},
        "env": {"PATH": "/usr/bin:/bin"},
        "workdir": "/srv",
        "memory_mb": 512,
        "vcpus": None,
        "source": "alpine:3.20",
        "created_at": 1000.0,
        "build_ms": 1234,
    }
    values.update(fields)
    return Template(**values)  # type: ignore[arg-type]


async def _publish(
    store: TemplateStore, name: str, data: bytes, key: str | None = None
) -> Template:
    async with store.build_dir() as staging:
        image = staging / "output.raw"
        image.write_bytes(data)
        return await store.publish(_template(name, data), image, inputs_key=key)


def _age(store: TemplateStore, template: Template, when: float) -> None:
    os.utime(store.blob_path(template.digest), (when, when))


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


async def test_publish_then_lookup_by_name(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    published = await _publish(store, "py", b"image one")
    assert await store.get("py") == published
    blob = store.blob_path(published.digest)
    assert blob.read_bytes() == b"image one"
    assert blob.name == published.digest.removeprefix("sha256:") + ".erofs"
    assert await store.get("other") is None
    assert await store.list() == [published]


async def test_lookup_by_inputs_key(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    published = await _publish(store, "py", b"image one", key="k1")
    assert await store.get_by_inputs("k1") == published
    assert await store.get_by_inputs("k2") is None
    renamed = await store.name("py2", published, memory_mb=None, vcpus=2)
    assert (renamed.name, renamed.digest, renamed.vcpus, renamed.build_ms) == (
        "py2",
        published.digest,
        2,
        0,
    )
    assert await store.get("py2") == renamed
    assert {t.name for t in await store.list()} == {"py", "py2"}


async def test_a_rebuilt_name_gets_the_new_digest(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    first = await _publish(store, "py", b"first build", key="k1")
    second = await _publish(store, "py", b"second build", key="k2")
    assert first.digest != second.digest
    got = await store.get("py")
    assert got is not None and got.digest == second.digest
    # an image lives as long as a name refers to it: the old one is gone, and no cache hit
    # leads to it any more
    assert not store.blob_path(first.digest).exists()
    assert await store.get_by_inputs("k1") is None
    assert await store.get_by_inputs("k2") == second


async def test_eviction_takes_the_least_recently_used_images_with_their_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = TemplateStore(tmp_path, 10_000)
    a = await _publish(store, "a", b"a" * 3000)
    b = await _publish(store, "b", b"b" * 3000)
    for template in (a, b):
        _age(store, template, OLD)
    _age(store, b, OLD - 100)  # b: the least recently used image
    assert (await store.get("a")) == a  # a used just now
    c = await _publish(store, "c", b"c" * 3000)
    # 9000 fits
    assert {t.name for t in await store.list()} == {"a", "b", "c"}
    _age(store, a, OLD)
    _age(store, b, OLD - 100)
    with caplog.at_level(logging.INFO, logger="exec_sandbox"):
        await _publish(store, "d", b"d" * 3000)
    # 12000 again, every image named: b, the least recently used, goes with its record
    assert not store.blob_path(b.digest).exists()
    assert {t.name for t in await store.list()} == {"a", "c", "d"}
    assert await store.get("b") is None
    assert "template(s) b" in caplog.text
    assert store.blob_path(c.digest).exists()


async def test_images_used_recently_are_not_evicted(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 100)
    a = await _publish(store, "a", b"a" * 80)
    b = await _publish(store, "b", b"b" * 80)
    # over the cap, but both were used within the grace period (a VM may be opening them)
    assert store.blob_path(a.digest).exists() and store.blob_path(b.digest).exists()


async def test_delete_removes_the_record_and_an_unused_image(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    published = await _publish(store, "py", b"image", key="k")
    _age(store, published, OLD)
    assert await store.delete("py") is True
    assert await store.get("py") is None
    assert await store.get_by_inputs("k") is None
    assert not store.blob_path(published.digest).exists()
    assert await store.delete("py") is False


async def test_delete_keeps_an_image_another_name_uses(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    published = await _publish(store, "py", b"image")
    await store.name("alias", published)
    _age(store, published, OLD)
    assert await store.delete("py") is True
    assert store.blob_path(published.digest).exists()
    assert await store.get("alias") is not None


async def test_concurrent_publishes_of_one_digest_keep_one_image(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    results = await asyncio.gather(*(_publish(store, f"t{i}", b"same bytes") for i in range(8)))
    assert len({r.digest for r in results}) == 1
    assert len(list((tmp_path / "blobs").iterdir())) == 1
    assert {t.name for t in await store.list()} == {f"t{i}" for i in range(8)}
    assert not list(tmp_path.glob(".build-*"))


async def test_a_published_image_is_never_rewritten(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    first = await _publish(store, "a", b"same bytes")
    inode = store.blob_path(first.digest).stat().st_ino
    await _publish(store, "b", b"same bytes")
    assert store.blob_path(first.digest).stat().st_ino == inode


async def test_a_failed_publish_leaves_nothing_behind(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    with pytest.raises(TemplateError, match="bytes"):
        async with store.build_dir() as staging:
            image = staging / "output.raw"
            image.write_bytes(b"twelve bytes")
            await store.publish(_template("t", b"twelve bytes", size_bytes=99), image)
    assert await store.get("t") is None
    assert {p for p in _files(tmp_path) if not p.startswith("locks/")} == set()
    assert not list(tmp_path.glob(".build-*"))


async def test_a_build_that_raises_leaves_no_staging(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    with pytest.raises(RuntimeError):
        async with store.build_dir() as staging:
            (staging / "output.raw").write_bytes(b"half")
            raise RuntimeError("the builder VM died")
    assert _files(tmp_path) == set()


async def test_a_damaged_record_is_dropped(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    published = await _publish(store, "py", b"image")
    record = tmp_path / "names" / "py.json"
    data = json.loads(record.read_text())
    data["size_bytes"] = "many"
    record.write_text(json.dumps(data))
    assert await store.get("py") is None
    assert not record.exists()
    assert store.blob_path(published.digest).exists()


async def test_a_record_whose_image_is_gone_or_truncated_is_dropped(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    a = await _publish(store, "a", b"image a")
    b = await _publish(store, "b", b"image b")
    store.blob_path(a.digest).unlink()
    store.blob_path(b.digest).write_bytes(b"short")
    assert await store.get("a") is None
    assert await store.get("b") is None
    assert await store.list() == []


@pytest.mark.parametrize("name", ["", "UPPER", "../x", "a/b", "-lead", "x" * 64, "a..b"])
async def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    store = TemplateStore(tmp_path, 1 << 30)
    with pytest.raises(InputValidationError):
        await store.get(name)
