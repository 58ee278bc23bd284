"""Templates against the default image, measured in the same run and interleaved call by call:

* the build of a template from an OCI archive of about 100 MB (the default image's own Debian
  package tree, packed with umoci on the host), against importing the same archive alone (skopeo
  copy + digest checks: the host's share of the build);
* `run("print(1)")` in that template and in the default image: the first run (a cold boot),
  then L1 restores, then warm-pool hits (a pool of one VM each, refilled before every pair);
  the template's tree holds the same python, so the difference is what a template costs (the
  overlay and chroot, its own snapshot and pool). Target: a template's L1 run within 1.5x of
  the default image's.

    .venv/bin/python bench/templates.py --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import percentile, summary, timed

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.templates.oci import import_image
from tests.templates_support import make_debian_layout

CODE = "print(1)"


def make_archive(where: Path) -> Path:
    """An oci-archive of the default image's package tree (python3, node, bash: ~300 MB
    unpacked, ~100 MB gzipped)."""
    layout = make_debian_layout(where / "layout")
    archive = where / "debian.oci.tar"
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(layout.iterdir()):
            tar.add(entry, arcname=entry.name)
    shutil.rmtree(layout)
    return archive


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-templates-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        archive = make_archive(work)
        print(
            f"archive: {archive.stat().st_size / 1e6:.0f} MB "
            f"(made in {time.perf_counter() - started:.0f} s)"
        )
        staging = work / "import"
        staging.mkdir()
        import_ms, _ = await timed(lambda: import_image(archive, staging))
        shutil.rmtree(staging)
        config = SchedulerConfig(
            template_cache_dir=work / "templates",
            memory_snapshot_cache_dir=work / "memory",
        )
        async with Scheduler(config) as sched:
            build_ms, template = await timed(lambda: sched.build_template("bench", image=archive))
            print(f"template: {json.dumps(template.languages)}, {template.size_bytes / 1e6:.0f} MB")
            print(f"build from the archive:     {build_ms:8.0f} ms")
            print(f"import alone (host share):  {import_ms:8.0f} ms")
            first = {}
            for name, extra in (("default", {}), ("template", {"template": "bench"})):
                ms, result = await timed(lambda extra=extra: sched.run(CODE, **extra))
                assert result.stdout == "1\n", result  # type: ignore[attr-defined]
                first[name] = ms
            print(f"first run, default image:   {first['default']:8.0f} ms")
            print(f"first run, template:        {first['template']:8.0f} ms")
            await sched.wait_snapshots(300)
            l1: dict[str, list[float]] = {"default": [], "template": []}
            for _ in range(args.runs):
                for name, extra in (("default", {}), ("template", {"template": "bench"})):
                    ms, result = await timed(lambda extra=extra: sched.run(CODE, **extra))
                    assert result.l1_cache_hit, f"{name}: not an L1 restore"  # type: ignore[attr-defined]
                    l1[name].append(ms)
            print(f"L1 run, default image:      {summary(l1['default'])}")
            print(f"L1 run, template:           {summary(l1['template'])}")
            ratio = percentile(l1["template"], 50) / percentile(l1["default"], 50)
            print(f"ratio template / default L1 (p50): {ratio:.2f}x (target <= 1.5x)")
        # Warm-pool hits: one idle VM of each, refilled (from the L1 snapshots above) before
        # every pair of runs.
        pooled = SchedulerConfig(
            template_cache_dir=work / "templates",
            memory_snapshot_cache_dir=work / "memory",
            warm_pool_size={"python": 1, "bench:python": 1},
        )
        async with Scheduler(pooled) as sched:
            hits: dict[str, list[float]] = {"default": [], "template": []}
            for _ in range(args.runs):
                await sched.wait_pool_ready(300)
                for name, extra in (("default", {}), ("template", {"template": "bench"})):
                    ms, result = await timed(lambda extra=extra: sched.run(CODE, **extra))
                    assert result.warm_pool_hit, f"{name}: not a pool hit"  # type: ignore[attr-defined]
                    hits[name].append(ms)
            print(f"pool hit, default image:    {summary(hits['default'])}")
            print(f"pool hit, template:         {summary(hits['template'])}")
            ratio = percentile(hits["template"], 50) / percentile(hits["default"], 50)
            print(f"ratio template / default pool hit (p50): {ratio:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
