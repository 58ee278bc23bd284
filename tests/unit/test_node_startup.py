"""Node's startup snapshot on the host (node_startup.py): its key, its cache, and which templates
give theirs. No VM here (the guest side is tests/c/guest_agent_test.py, the whole path
tests/integration/functional/test_node_startup_snapshot.py)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exec_sandbox.errors import GuestAgentError, SandboxError
from exec_sandbox.images.catalog import GuestImages
from exec_sandbox.packages.layer import PackageLayer
from exec_sandbox.snapshots import node_startup
from exec_sandbox.snapshots.identity import machine_identity
from exec_sandbox.snapshots.node_startup import BLOB_MAX, KEEP_BLOBS, NodeStartupCache, blob_key
from exec_sandbox.vm import binding, file_transfer, host_facts
from exec_sandbox.vm.file_transfer import ContentRefused
from exec_sandbox.vm.spec import VmSpec

TAG = b"t" * 64


def spec() -> VmSpec:
    images = GuestImages(Path("/k"), Path("/r"), kernel_hash="k1", rootfs_hash="r1")
    return VmSpec(qemu_binary=host_facts.qemu_binary(), images=images, accel="tcg", memory_mb=192)


def key(s: VmSpec) -> str:
    return blob_key(machine_identity(s))


def test_one_blob_serves_every_memory_size_and_device_layout_of_a_machine() -> None:
    base = spec()
    assert key(replace(base, memory_mb=1024)) == key(base)
    assert key(replace(base, net_port=True)) == key(base)
    images = base.images
    others = {
        key(replace(base, accel="kvm")),
        key(replace(base, vcpus=2)),
        key(replace(base, images=replace(images, rootfs_hash="r2"))),
        key(replace(base, kernel_cmdline_extra="tsc_early_khz=1")),
    }
    assert len(others) == 4 and key(base) not in others


async def test_the_cache_keeps_bounded_intact_blobs_and_the_newest_few(tmp_path: Path) -> None:
    cache = NodeStartupCache(tmp_path)
    path = tmp_path / "node-startup-a.blob"
    assert await cache.load("a") is None
    await cache.store("a", TAG + b"blob a")
    assert await cache.load("a") == TAG + b"blob a"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # A damaged file (a flipped bit past the tag, a torn write) is dropped, never handed out;
    # so is what no guest could have sent (a tag alone) and what is over the bound.
    stored = bytearray(path.read_bytes())
    stored[-1] ^= 1
    path.write_bytes(bytes(stored))
    assert await cache.load("a") is None and not path.exists()
    await cache.store("a", TAG)
    assert await cache.load("a") is None and not path.exists()
    with (tmp_path / "node-startup-b.blob").open("wb") as big:
        big.truncate(32 + BLOB_MAX + 1)
    assert await cache.load("b") is None and not (tmp_path / "node-startup-b.blob").exists()
    for i, name in enumerate(["c", "d", "e", "f"]):
        await cache.store(name, TAG + name.encode())
        os.utime(tmp_path / f"node-startup-{name}.blob", (1000 + i, 1000 + i))
    stale_partial = tmp_path / ".node-startup-x.abc.partial"
    stale_partial.write_bytes(b"a writer that died")
    os.utime(stale_partial, (1000, 1000))
    await cache.store("c", TAG + b"c again")  # the one just stored is never pruned
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == KEEP_BLOBS and "node-startup-c.blob" in left, left
    await cache.discard("c")
    assert await cache.load("c") is None


async def test_stores_of_one_key_at_once_leave_one_whole_blob(tmp_path: Path) -> None:
    cache = NodeStartupCache(tmp_path)
    blobs = [TAG + bytes([i]) * 3_000_000 for i in range(4)]
    await asyncio.gather(*(cache.store("k", blob) for blob in blobs))
    assert await cache.load("k") in blobs
    assert [p.name for p in tmp_path.iterdir()] == ["node-startup-k.blob"]


async def test_a_cache_that_cannot_keep_a_blob_does_not_fail_its_caller(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_bytes(b"")
    cache = NodeStartupCache(not_a_directory)
    await cache.store("k", TAG + b"blob")  # logged, not raised: the blob only saves time
    assert await cache.load("k") is None


class _Vm:
    def __init__(self, alive: bool) -> None:
        self.alive = alive


@pytest.mark.parametrize(
    "error, alive, outcome",
    [
        (None, True, "taken"),
        (ContentRefused("another CPU"), True, "refused"),  # the only case that drops the blob
        (SandboxError("guest I/O error"), True, "failed"),
        (FileNotFoundError("no /tmp"), True, "failed"),
        (GuestAgentError("stalled: the VM was closed"), False, None),  # raised, like any request
    ],
)
async def test_install_tells_a_refusal_from_a_failure(
    monkeypatch: pytest.MonkeyPatch, error: Exception | None, alive: bool, outcome: str | None
) -> None:
    async def write_target(vm: Any, path: bytes, content: bytes, flags: int) -> int:
        assert (path, flags) == (b"", binding.FILE_NODE_SNAPSHOT)
        if error is not None:
            raise error
        return len(content)

    monkeypatch.setattr(file_transfer, "write_target", write_target)
    if outcome is None:
        with pytest.raises(GuestAgentError):
            await node_startup.install(_Vm(alive), TAG + b"blob")  # type: ignore[arg-type]
    else:
        assert await node_startup.install(_Vm(alive), TAG + b"blob") == outcome  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cached, outcome, built, layer, stored",
    [
        (True, "taken", False, False, False),  # the machine's blob, taken in: nothing built
        (True, "refused", True, False, True),  # another CPU's: dropped, built, kept anew
        (True, "failed", True, False, True),  # not written (the VM is fine): built, kept anew
        (False, None, True, False, True),  # none yet: built in the VM, kept
        (False, None, True, True, False),  # a package layer's template: built, never kept
    ],
)
async def test_which_templates_give_their_blob(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cached: bool,
    outcome: str | None,
    built: bool,
    layer: bool,
    stored: bool,
) -> None:
    cache = NodeStartupCache(tmp_path)
    s = spec()
    if layer:
        s = replace(
            s,
            layer=PackageLayer(
                key="L", path=tmp_path / "layer.img", kind="javascript", report=None
            ),
        )  # type: ignore[arg-type]
    if cached:
        await cache.store(key(s), TAG + b"old")
    calls: list[str] = []

    async def install(vm: Any, blob: bytes) -> str | None:
        calls.append("install")
        return outcome

    async def build(vm: Any) -> bool:
        calls.append("build")
        return True

    async def read_out(vm: Any) -> bytes:
        calls.append("read_out")
        return TAG + b"new"

    monkeypatch.setattr(node_startup, "install", install)
    monkeypatch.setattr(node_startup, "read_out", read_out)
    monkeypatch.setattr(node_startup, "_build_in_vm", build)
    await node_startup.give_template_blob(object(), s, cache)  # type: ignore[arg-type]
    assert ("build" in calls) == built
    assert ("read_out" in calls) == stored
    kept = await cache.load(key(s))
    if stored:
        assert kept == TAG + b"new"
    elif cached and outcome == "taken":
        assert kept == TAG + b"old"
    else:
        assert kept is None
