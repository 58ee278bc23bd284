"""Packages in real VMs, from an index and an npm registry served on 127.0.0.1 from packages the
tests make (deterministic, no network): the layer is mounted where the interpreters look,
read-only, with hash-based bytecode; sessions, snapshots and the pool use it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_sandbox import PackageNotAllowedError, Scheduler, SnapshotError
from exec_sandbox.images.catalog import load_images
from exec_sandbox.paths import images_dir
from tests.helpers import private_config, qemu_processes
from tests.package_index import LocalIndex, LocalNpmRegistry, make_npm_tarball, make_wheel

pytestmark = pytest.mark.vm

DEMO = "sbxdemo==1.0.0"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalIndex]:
    build = tmp_path / "dists"
    build.mkdir()
    with LocalIndex(tmp_path / "index") as served:
        served.publish(
            make_wheel(
                build,
                "sbxdemo",
                "1.0.0",
                {
                    "sbxdemo/__init__.py": "VALUE = 'from-the-layer'\ndef main():\n    print('cli', VALUE)\n"  # noqa: E501
                },
                scripts={"sbxdemo-cli": "sbxdemo:main"},
            )
        )
        for name, value in served.pip_env().items():
            monkeypatch.setenv(name, value)
        yield served


@pytest.fixture
def npm_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalNpmRegistry]:
    build = tmp_path / "npm-dists"
    build.mkdir()
    with LocalNpmRegistry(tmp_path / "registry") as served:
        served.publish(
            "sbxjs",
            {
                "1.0.0": make_npm_tarball(
                    build,
                    "sbxjs",
                    "1.0.0",
                    {"index.js": "exports.hello = () => 'hello from the layer';\n"},
                )
            },
        )
        for name, value in served.npm_env(tmp_path).items():
            monkeypatch.setenv(name, value)
        yield served


GUEST_CHECKS = r"""
import os, sys, subprocess, importlib.util, sbxdemo
print(sbxdemo.VALUE, sbxdemo.__file__)
pyc = importlib.util.cache_from_source(sbxdemo.__file__)
flags = int.from_bytes(open(pyc, "rb").read()[4:8], "little")
print("pyc flags", flags)  # 1: hash-based, never checked against the source
script = os.path.join(os.path.dirname(sbxdemo.__file__), "..", "bin", "sbxdemo-cli")
print(open(script).readline().strip())
print(subprocess.run([script], capture_output=True, text=True).stdout.strip())
opts = [l.split()[3] for l in open("/proc/mounts") if l.split()[1] == "/usr/lib/sbx/layers/python"]
print("mount", opts)
try:
    open(os.path.join(os.path.dirname(sbxdemo.__file__), "x"), "w")
except OSError as e:
    print("write", e.strerror)
"""


async def test_python_code_imports_a_package_from_its_layer(
    sched: Scheduler, index: LocalIndex
) -> None:
    result = await sched.run(GUEST_CHECKS, packages=[DEMO])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    python = load_images(images_dir()).guest.python  # type: ignore[union-attr]
    site = f"/usr/local/lib/python{python}/dist-packages"
    assert lines[0] == f"from-the-layer {site}/sbxdemo/__init__.py"
    assert lines[1] == "pyc flags 1"
    assert lines[2] == "#!/usr/bin/python3"  # the console script runs the guest's python
    assert lines[3] == "cli from-the-layer"
    options = lines[4]
    assert "'ro," in options and "nosuid" in options and "nodev" in options
    assert lines[5] == "write Read-only file system"
    assert result.packages is not None and result.packages.packages == (DEMO,)
    assert not result.packages.cache_hit and result.timing.packages_ms > 0


async def test_without_packages_the_guest_has_none(sched: Scheduler, index: LocalIndex) -> None:
    result = await sched.run("import sbxdemo")
    assert result.exit_code == 1 and "No module named 'sbxdemo'" in result.stderr
    assert result.packages is None


async def test_a_session_keeps_state_with_packages(sched: Scheduler, index: LocalIndex) -> None:
    async with await sched.session(packages=[DEMO]) as session:
        assert session.packages is not None and session.packages.packages == (DEMO,)
        await session.exec("import sbxdemo\nx = sbxdemo.VALUE.upper()")
        result = await session.exec("print(x)")
        assert result.stdout == "FROM-THE-LAYER\n"


async def test_a_truncated_layer_is_rebuilt_before_the_vm_uses_it(
    sched: Scheduler, index: LocalIndex
) -> None:
    first = await sched.run("import sbxdemo; print(sbxdemo.VALUE)", packages=[DEMO])
    assert first.stdout == "from-the-layer\n"
    image = next((sched.config.package_cache_dir / "layers").glob("*/layer.erofs"))
    os.truncate(image, image.stat().st_size // 3)
    second = await sched.run("import sbxdemo; print(sbxdemo.VALUE)", packages=[DEMO])
    assert second.stdout == "from-the-layer\n", second.stderr
    assert second.packages is not None and not second.packages.cache_hit


async def test_a_paused_session_resumes_after_its_layer_left_the_cache(
    sched: Scheduler, index: LocalIndex
) -> None:
    session = await sched.session(packages=[DEMO])
    await session.exec("import sbxdemo\nx = sbxdemo.VALUE.upper()")
    snapshot = await session.pause()
    layers = sched.config.package_cache_dir / "layers"
    for layer in layers.iterdir():  # the package cache evicts it (or a user clears the cache)
        shutil.rmtree(layer)
    async with await sched.resume(snapshot) as resumed:
        result = await resumed.exec("print(x, open(sbxdemo.__file__).readline().strip())")
    assert result.stdout == "FROM-THE-LAYER VALUE = 'from-the-layer'\n", result.stderr
    # Its own copy damaged too: a clear refusal, nothing runs.
    copy = sched.config.memory_snapshot_cache_dir / "sessions" / snapshot.id / "layer"
    os.truncate(copy, copy.stat().st_size // 2)
    with pytest.raises(SnapshotError, match="no longer in the package cache"):
        await sched.resume(snapshot)


async def test_javascript_require_and_import_find_the_layer(
    sched: Scheduler, npm_registry: LocalNpmRegistry
) -> None:
    code = (
        "const a = require('sbxjs');\n"
        "import('sbxjs').then((m) => console.log(a.hello(), '|', m.default.hello(),"
        " '|', require.resolve('sbxjs')));\n"
    )
    result = await sched.run(code, language="javascript", packages=["sbxjs@1.0.0"])
    assert result.exit_code == 0, result.stderr
    # node resolves /node_modules (the image's link) to the layer's mount point.
    assert result.stdout == (
        "hello from the layer | hello from the layer | "
        "/usr/lib/sbx/layers/javascript/sbxjs/index.js\n"
    )
    assert result.packages is not None and result.packages.packages == ("sbxjs@1.0.0",)
    async with await sched.session(language="javascript", packages=["sbxjs@1.0.0"]) as session:
        await session.exec("const { hello } = require('sbxjs');")
        assert (await session.exec("console.log(hello())")).stdout == "hello from the layer\n"
    with pytest.raises(PackageNotAllowedError, match="No matching version found for sbxjs@9.9.9"):
        await sched.run("1", language="javascript", packages=["sbxjs@9.9.9"])


async def test_l1_snapshots_of_a_package_set_are_its_own(
    tmp_path: Path, images_ready: None, index: LocalIndex
) -> None:
    async with Scheduler(private_config(tmp_path, memory_snapshots=True)) as scheduler:
        cold = await scheduler.run("import sbxdemo; print(sbxdemo.VALUE)", packages=[DEMO])
        assert cold.stdout == "from-the-layer\n" and not cold.l1_cache_hit
        assert await scheduler.wait_snapshots(timeout=120)
        restored = await scheduler.run("import sbxdemo; print(sbxdemo.VALUE)", packages=[DEMO])
        assert restored.l1_cache_hit and restored.stdout == "from-the-layer\n"
        assert restored.packages is not None and restored.packages.cache_hit
        # The plain configuration has a snapshot of its own, not this one.
        plain = await scheduler.run("import sys; print('sbxdemo' in sys.modules)")
        assert not plain.l1_cache_hit and plain.stdout == "False\n"
    assert qemu_processes(parent=os.getpid()) == []


async def test_default_packages_are_in_the_warm_pool(
    tmp_path: Path, images_ready: None, index: LocalIndex
) -> None:
    config = private_config(
        tmp_path, warm_pool_size=1, max_concurrent_vms=4, default_packages={"python": [DEMO]}
    )
    async with Scheduler(config) as scheduler:
        await scheduler.wait_pool_ready(timeout=240)
        hit = await scheduler.run("import sbxdemo; print(sbxdemo.VALUE)")
        assert hit.warm_pool_hit and hit.stdout == "from-the-layer\n"
        assert hit.packages is not None and hit.packages.packages == (DEMO,)
    assert qemu_processes(parent=os.getpid()) == []


def test_sbx_run_installs_packages(tmp_path: Path, images_ready: None, index: LocalIndex) -> None:
    env = {
        **os.environ,
        "EXEC_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
    }
    run = [sys.executable, "-m", "exec_sandbox.cli.main", "run", "--no-snapshot-wait"]
    proc = subprocess.run(
        [*run, "--json", "-p", DEMO, "-c", "import sbxdemo; print(sbxdemo.VALUE)"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["stdout"] == "from-the-layer\n"
    assert result["packages"]["packages"] == [DEMO] and not result["packages"]["cache_hit"]
    bad = subprocess.run(
        [*run, "-p", "sbxdemo; rm -rf /", "-c", "print(1)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert bad.returncode == 2 and "not allowed" in bad.stderr
