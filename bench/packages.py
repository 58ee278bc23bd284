"""Package layers, all in one run on this machine:

1. the first run() with pandas (builds the layer: resolve, download, unpack, compile, image) and
   the second (layer from the cache, VM from its own L1 snapshot), against a plain print(1) L1
   restore plus the import itself measured inside the guest;
2. `import pandas` inside the guest from a layer with precompiled hash-based bytecode and from
   one without (cold-booted VMs, so both start with a cold page cache);
3. the peer design, installing the same wheels with pip inside a VM, against the host-built
   layer (unpack + compile + image on the host).

    .venv/bin/python bench/packages.py --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.images.catalog import load_images
from exec_sandbox.packages import pip_layer
from exec_sandbox.packages.specs import validate_packages
from exec_sandbox.packages.target import GuestTarget
from exec_sandbox.paths import images_dir

PANDAS = ["pandas==2.2.3"]
# The import's own time, measured in the guest, goes to stderr (stdout stays the version).
CODE = (
    "import sys, time; t = time.perf_counter(); import pandas; "
    "print(pandas.__version__); print(round((time.perf_counter() - t) * 1000), file=sys.stderr)"
)


def config(root: Path, **overrides: Any) -> SchedulerConfig:
    values: dict[str, Any] = {
        "package_cache_dir": root / "packages",
        "memory_snapshot_cache_dir": root / "memory",
        "max_concurrent_vms": 4,
    }
    values.update(overrides)
    return SchedulerConfig(**values)


def import_ms(stderr: str) -> int:
    return int(stderr.strip().splitlines()[-1])


async def first_and_second(root: Path, runs: int) -> dict[str, Any]:
    print("== 1. first and second run() with pandas==2.2.3 ==")
    async with Scheduler(config(root)) as sched:
        started = time.perf_counter()
        first = await sched.run(CODE, packages=PANDAS, timeout_seconds=120)
        total = (time.perf_counter() - started) * 1000
        assert first.exit_code == 0, first.stderr
        assert first.packages is not None
        print(
            f"first run: {total:.0f} ms total; layer {first.packages.size_bytes / 1e6:.0f} MB, "
            f"{len(first.packages.packages)} packages ({', '.join(first.packages.packages)})"
        )
        for phase, ms in first.packages.build_ms.items():
            print(f"  {phase:9s} {ms:6d} ms")
        print(f"  boot {first.timing.boot_ms} ms, import in the guest {import_ms(first.stderr)} ms")
        await sched.wait_snapshots(300)
        assert await sched.prepare_snapshot("python")
    seconds: list[float] = []
    imports: list[float] = []
    plain: list[float] = []
    async with Scheduler(config(root)) as sched:
        for _ in range(runs):  # interleaved: both see the same load
            started = time.perf_counter()
            second = await sched.run(CODE, packages=PANDAS, timeout_seconds=120)
            seconds.append((time.perf_counter() - started) * 1000)
            assert second.l1_cache_hit and second.packages is not None and second.packages.cache_hit
            imports.append(import_ms(second.stderr))
            started = time.perf_counter()
            one = await sched.run("print(1)")
            plain.append((time.perf_counter() - started) * 1000)
            assert one.l1_cache_hit
    print(f"second run (layer cached, L1 restore): {summary(seconds)}")
    print(f"  import pandas in the guest:           {summary(imports)}")
    print(f"plain print(1) L1 restore:             {summary(plain)}")
    bound = percentile(plain, 50) + percentile(imports, 50)
    ratio = percentile(seconds, 50) / bound
    print(f"second run / (plain L1 + import) = {ratio:.2f}x (target <= 1.5x)")
    return {"build_ms": first.packages.build_ms}


async def bytecode(root: Path, runs: int) -> None:
    print("\n== 2. import pandas in the guest: precompiled hash-based bytecode vs none ==")
    with_bc: list[float] = []
    without_bc: list[float] = []
    original = pip_layer.compile_bytecode

    async def no_bytecode(tree: Path, target: GuestTarget) -> bool:
        return False

    for label, store, out in (
        ("with", root / "bc", with_bc),
        ("without", root / "nobc", without_bc),
    ):
        pip_layer.compile_bytecode = original if label == "with" else no_bytecode  # type: ignore[assignment]
        try:
            async with Scheduler(config(store, memory_snapshots=False)) as sched:
                for _ in range(runs):
                    result = await sched.run(CODE, packages=PANDAS, timeout_seconds=120)
                    assert result.exit_code == 0, result.stderr
                    out.append(import_ms(result.stderr))
        finally:
            pip_layer.compile_bytecode = original  # type: ignore[assignment]
    print(f"with bytecode:    {summary(with_bc)}")
    print(f"without bytecode: {summary(without_bc)}")
    print(f"without / with = {percentile(without_bc, 50) / percentile(with_bc, 50):.2f}x")


async def peer(root: Path, build_ms: dict[str, int]) -> None:
    print("\n== 3. pip install inside the guest (the peer design) vs the host-built layer ==")
    target = GuestTarget.of(load_images(images_dir()))
    work = root / "peer"
    work.mkdir()
    specs = validate_packages(PANDAS, "python", strict=True)
    wheels = await pip_layer.resolve(specs, target, work)
    await pip_layer.download(wheels, target, work / "wheels")
    proc = await asyncio.create_subprocess_exec(
        *pip_layer.pip_argv(
            "download", "--no-deps", "--only-binary=:all:", "-d", str(work / "pip"), "pip"
        ),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await proc.wait()
    pip_wheel = next((work / "pip").glob("pip-*.whl"))
    async with Scheduler(config(root / "peer-cache", memory_snapshots=False)) as sched:
        async with await sched.session(memory_mb=1024, timeout_seconds=300) as session:
            started = time.perf_counter()
            for wheel in [*(work / "wheels").glob("*.whl"), pip_wheel]:
                await session.write_file(f"wheels/{wheel.name}", wheel)
            transfer = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            install = await session.exec(
                f"import subprocess, glob, sys\n"
                f"wheels = [w for w in glob.glob('wheels/*.whl') if not w.startswith('wheels/pip-')]\n"  # noqa: E501
                f"r = subprocess.run([sys.executable, 'wheels/{pip_wheel.name}/pip', 'install', '--no-index',"  # noqa: E501
                f" '--no-deps', '--target', 'site', '--disable-pip-version-check', *wheels],"
                f" capture_output=True, text=True)\n"
                f"print(r.returncode, r.stderr[-500:])\n",
                timeout_seconds=300,
            )
            installed = (time.perf_counter() - started) * 1000
            assert install.stdout.startswith("0"), install.stdout
            started = time.perf_counter()
            imported = await session.exec("import sys; sys.path.insert(0, 'site')\n" + CODE)
            first_import = (time.perf_counter() - started) * 1000
            assert imported.stdout.strip() == "2.2.0", imported.stderr
    in_guest = transfer + installed + first_import
    host = sum(build_ms.get(k, 0) for k in ("unpack", "compile", "image"))
    print(
        f"in the guest: transfer {transfer:.0f} ms + pip install {installed:.0f} ms "
        f"+ first import {first_import:.0f} ms = {in_guest:.0f} ms"
    )
    print(
        f"on the host:  unpack + compile + image = {host} ms (then imports read precompiled bytecode)"  # noqa: E501
    )
    print(
        f"in-guest install / host-built layer = {in_guest / host:.1f}x (target >= 3x); "
        f"pip install alone {installed / host:.1f}x"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sbx-bench-packages-") as tmp:
        root = Path(tmp)
        first = await first_and_second(root, args.runs)
        await bytecode(root, max(2, args.runs // 2))
        await peer(root, first["build_ms"])


if __name__ == "__main__":
    asyncio.run(main())
