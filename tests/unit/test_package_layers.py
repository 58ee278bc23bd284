"""Building and caching package layers on the host (no VM): against an index served on
127.0.0.1 from wheels the tests make, with the host's pip and mkfs.erofs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_sandbox import PackageNotAllowedError, VmPermanentError
from exec_sandbox.images.catalog import GuestFacts, GuestImages
from exec_sandbox.packages.layers import PackageLayers
from exec_sandbox.packages.specs import validate_packages
from exec_sandbox.packages.store import LAYER_FILE, LayerStore
from tests.package_index import LocalIndex, make_sdist, make_wheel

IMAGES = GuestImages(
    kernel=Path("/k"),
    rootfs=Path("/r"),
    kernel_hash="k",
    rootfs_hash="r",
    guest=GuestFacts(python="3.11", glibc="2.36", tree="0123abcd"),
)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalIndex]:
    build = tmp_path / "dists"
    build.mkdir()
    with LocalIndex(tmp_path / "index") as served:
        served.publish(
            make_wheel(build, "sbxdemo", "1.0.0", {"sbxdemo/__init__.py": "VALUE = 'one'\n"}),
            make_wheel(
                build,
                "sbxdep",
                "2.0.0",
                {"sbxdep/__init__.py": "import sbxdemo\n"},
                requires=("sbxdemo==1.0.0",),
            ),
            make_wheel(
                build, "sbxmac", "1.0.0", {"sbxmac.py": ""}, tag="cp311-cp311-macosx_11_0_arm64"
            ),
            make_sdist(build, "sbxsource", "1.0.0"),
        )
        for name, value in served.pip_env().items():
            monkeypatch.setenv(name, value)
        yield served


def specs(*packages: str) -> tuple:  # type: ignore[type-arg]
    return validate_packages(list(packages), "python", strict=True)


async def test_a_layer_is_built_once_then_served_from_the_cache(
    tmp_path: Path, index: LocalIndex
) -> None:
    layers = PackageLayers(tmp_path / "cache", 1 << 30)
    first = await layers.get("python", specs("sbxdep==2.0.0"), IMAGES)
    assert first is not None
    assert first.report.packages == ("sbxdemo==1.0.0", "sbxdep==2.0.0")  # dependency resolved
    assert not first.report.cache_hit and first.report.resolved
    assert set(first.report.build_ms) == {"resolve", "download", "unpack", "compile", "image"}
    assert first.path.read_bytes()[1024:1028] == b"\xe2\xe1\xf5\xe0"  # the EROFS magic
    fetched = sum(index.fetches.values())

    second = await layers.get("python", specs("sbxdep==2.0.0"), IMAGES)
    assert second is not None and second.path == first.path and second.key == first.key
    assert second.report.cache_hit and not second.report.resolved and second.report.build_ms == {}
    assert (layers.resolves, layers.builds) == (1, 1)
    assert sum(index.fetches.values()) == fetched


async def test_a_known_request_needs_no_index_in_a_new_process(
    tmp_path: Path, index: LocalIndex
) -> None:
    built = await PackageLayers(tmp_path / "cache", 1 << 30).get(
        "python", specs("sbxdemo==1.0.0"), IMAGES
    )
    index.__exit__()  # the index is gone
    fresh = PackageLayers(tmp_path / "cache", 1 << 30)
    again = await fresh.get("python", specs("sbxdemo==1.0.0"), IMAGES)
    assert again is not None and built is not None and again.path == built.path
    assert (fresh.resolves, fresh.builds) == (0, 0)


async def test_concurrent_calls_of_one_process_share_one_build(
    tmp_path: Path, index: LocalIndex
) -> None:
    layers = PackageLayers(tmp_path / "cache", 1 << 30)
    results = await asyncio.gather(
        *(layers.get("python", specs("sbxdemo==1.0.0"), IMAGES) for _ in range(3))
    )
    assert layers.builds == 1
    assert len({r.path for r in results if r is not None}) == 1


async def test_builders_racing_for_one_key_build_it_once(tmp_path: Path, index: LocalIndex) -> None:
    """Two caches on one directory (two open files: flock treats them as two processes) start
    the build of the same key at the same moment: one builds, the other waits and takes it."""
    a, b = PackageLayers(tmp_path / "cache", 1 << 30), PackageLayers(tmp_path / "cache", 1 << 30)
    lock = await a._resolve("python", specs("sbxdemo==1.0.0"), a_target())
    stored = await asyncio.gather(
        a._build("python", "python-k", lock, a_target(), print, {}),
        b._build("python", "python-k", lock, a_target(), print, {}),
    )
    assert a.builds + b.builds == 1
    assert stored[0].path == stored[1].path


def test_builders_in_two_processes_build_once(tmp_path: Path, index: LocalIndex) -> None:
    script = (
        "import asyncio, json, sys; from pathlib import Path\n"
        "from tests.unit.test_package_layers import IMAGES, specs\n"
        "from exec_sandbox.packages.layers import PackageLayers\n"
        "layers = PackageLayers(Path(sys.argv[1]), 1 << 30)\n"
        "layer = asyncio.run(layers.get('python', specs('sbxdep==2.0.0'), IMAGES))\n"
        "print(json.dumps([layers.builds, str(layer.path)]))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "cache")],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for _ in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=240)[0]) for p in procs]
    assert sum(builds for builds, _ in outs) == 1
    assert outs[0][1] == outs[1][1]


async def test_a_truncated_layer_is_rebuilt(tmp_path: Path, index: LocalIndex) -> None:
    layers = PackageLayers(tmp_path / "cache", 1 << 30)
    built = await layers.get("python", specs("sbxdemo==1.0.0"), IMAGES)
    assert built is not None
    size = built.path.stat().st_size
    os.truncate(built.path, size // 2)
    again = await layers.get("python", specs("sbxdemo==1.0.0"), IMAGES)
    assert again is not None and not again.report.cache_hit
    assert layers.builds == 2 and again.path.stat().st_size == size


async def test_a_changed_byte_is_found_by_a_new_process_and_rebuilt(
    tmp_path: Path, index: LocalIndex
) -> None:
    built = await PackageLayers(tmp_path / "cache", 1 << 30).get(
        "python", specs("sbxdemo==1.0.0"), IMAGES
    )
    assert built is not None
    data = bytearray(built.path.read_bytes())
    data[-100] ^= 0xFF  # same size: only the digest can tell
    built.path.write_bytes(bytes(data))
    fresh = PackageLayers(tmp_path / "cache", 1 << 30)
    again = await fresh.get("python", specs("sbxdemo==1.0.0"), IMAGES)
    assert fresh.builds == 1 and again is not None
    assert again.path.read_bytes() != bytes(data)


@pytest.mark.parametrize("package", ["sbxsource==1.0.0", "sbxmac==1.0.0", "sbxnothere==1.0.0"])
async def test_a_package_without_a_guest_wheel_is_named(
    tmp_path: Path, index: LocalIndex, package: str
) -> None:
    layers = PackageLayers(tmp_path / "cache", 1 << 30)
    with pytest.raises(PackageNotAllowedError, match=package.split("==")[0]) as info:
        await layers.get("python", specs(package), IMAGES)
    assert "source only" in str(info.value)
    assert not (tmp_path / "cache" / "layers").exists() or not any(
        (tmp_path / "cache" / "layers").iterdir()
    )


async def test_a_missing_build_tool_names_its_package(
    tmp_path: Path, index: LocalIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no mkfs.erofs, no npm
    layers = PackageLayers(tmp_path / "cache", 1 << 30)
    with pytest.raises(VmPermanentError, match=r"apt-get install erofs-utils"):
        await layers.get("python", specs("sbxdemo==1.0.0"), IMAGES)
    with pytest.raises(VmPermanentError, match=r"apt-get install npm"):
        await layers.get(
            "javascript", validate_packages(["left-pad@1.3.0"], "javascript", strict=True), IMAGES
        )


async def test_eviction_keeps_recent_layers_under_the_cap(tmp_path: Path) -> None:
    store = LayerStore(tmp_path, max_bytes=2500)
    now = time.time()
    for i, age in enumerate([7200, 3600, 1800, 60]):
        directory = tmp_path / "layers" / f"l{i}"
        directory.mkdir(parents=True)
        (directory / LAYER_FILE).write_bytes(b"x" * 1000)
        os.utime(directory, (now - age, now - age))
    await store.evict()
    # 4000 bytes over a 2500 cap: the two least recently used go.
    assert sorted(p.name for p in (tmp_path / "layers").iterdir()) == ["l2", "l3"]
    store.max_bytes = 0
    await store.evict()
    # Used within the last ten minutes: kept even over the cap (a VM may be opening it).
    assert sorted(p.name for p in (tmp_path / "layers").iterdir()) == ["l3"]


def a_target():  # type: ignore[no-untyped-def]
    from exec_sandbox.packages.target import GuestTarget

    return GuestTarget.of(IMAGES)
