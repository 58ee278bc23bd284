"""Node's startup snapshot on the host (node_startup.py): its key, its cache, and which templates
give theirs. No VM here (the guest side is tests/c/guest_agent_test.py, the whole path
tests/integration/functional/test_node_startup_snapshot.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exec_sandbox import host, node_startup, snapshots
from exec_sandbox.images import GuestImages
from exec_sandbox.node_startup import BLOB_MAX, KEEP_BLOBS, NodeStartupCache, blob_key
from exec_sandbox.packages.layer import PackageLayer
from exec_sandbox.snapshots import machine_identity
from exec_sandbox.vm_spec import VmSpec

TAG = b"t" * 64


def spec() -> VmSpec:
    images = GuestImages(Path("/k"), Path("/r"), kernel_hash="k1", rootfs_hash="r1")
    return VmSpec(qemu_binary=host.qemu_binary(), images=images, accel="tcg", memory_mb=192)


def key(s: VmSpec) -> str:
    return blob_key(machine_identity(s))


def test_one_blob_serves_every_memory_size_and_device_layout_of_a_machine() -> None:
    base = spec()
    assert key(replace(base, memory_mb=1024)) == key(base)
    assert key(replace(base, net_port=True)) == key(base)
    images = base.images
    others = {key(replace(base, accel="kvm")), key(replace(base, vcpus=2)),
              key(replace(base, images=replace(images, rootfs_hash="r2"))),
              key(replace(base, kernel_cmdline_extra="tsc_early_khz=1"))}  # fmt: skip
    assert len(others) == 4 and key(base) not in others


async def test_the_cache_keeps_bounded_blobs_and_the_newest_few(tmp_path: Path) -> None:
    cache = NodeStartupCache(tmp_path)
    assert await cache.load("a") is None
    await cache.store("a", TAG + b"blob a")
    assert await cache.load("a") == TAG + b"blob a"
    assert oct((tmp_path / "node-startup-a.blob").stat().st_mode & 0o777) == "0o600"
    # What no guest could have sent (a tag alone, over the bound) is dropped, not handed out.
    (tmp_path / "node-startup-a.blob").write_bytes(TAG)
    assert await cache.load("a") is None and not (tmp_path / "node-startup-a.blob").exists()
    with (tmp_path / "node-startup-b.blob").open("wb") as big:
        big.truncate(BLOB_MAX + 1)
    assert await cache.load("b") is None and not (tmp_path / "node-startup-b.blob").exists()
    for i, name in enumerate(["c", "d", "e", "f"]):
        await cache.store(name, TAG + name.encode())
        os.utime(tmp_path / f"node-startup-{name}.blob", (1000 + i, 1000 + i))
    await cache.store("c", TAG + b"c again")  # the one just stored is never pruned
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == KEEP_BLOBS and "node-startup-c.blob" in left, left
    await cache.discard("c")
    assert await cache.load("c") is None


@pytest.mark.parametrize("cached, accepted, built, layer, stored", [
    (True, True, False, False, False),   # the machine's blob, taken in: nothing built
    (True, False, True, False, True),    # refused (another CPU): dropped, built, kept anew
    (False, None, True, False, True),    # none yet: built in the VM, kept
    (False, None, True, True, False),    # a package layer's template: built, never kept
])  # fmt: skip
async def test_which_templates_give_their_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool, accepted: bool | None,
    built: bool, layer: bool, stored: bool,
) -> None:
    cache = NodeStartupCache(tmp_path)
    s = spec()
    if layer:
        s = replace(s, layer=PackageLayer(key="L", path=tmp_path / "layer.img", kind="javascript",
                                          report=None))  # type: ignore[arg-type]
    if cached:
        await cache.store(key(s), TAG + b"old")
    calls: list[str] = []

    async def install(vm: Any, blob: bytes) -> bool:
        calls.append("install")
        return bool(accepted)

    async def build(vm: Any) -> bool:
        calls.append("build")
        return True

    async def read_out(vm: Any) -> bytes:
        calls.append("read_out")
        return TAG + b"new"

    monkeypatch.setattr(node_startup, "install", install)
    monkeypatch.setattr(node_startup, "read_out", read_out)
    monkeypatch.setattr(snapshots, "_build_node_snapshot", build)
    await snapshots._give_node_snapshot(object(), s, cache)  # type: ignore[arg-type]
    assert ("build" in calls) == built
    assert ("read_out" in calls) == stored
    kept = await cache.load(key(s))
    if stored:
        assert kept == TAG + b"new"
    elif cached and accepted:
        assert kept == TAG + b"old"
    else:
        assert kept is None
