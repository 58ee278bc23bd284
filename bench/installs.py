"""`pip install` of a cached package inside a running session against the same package given as
`packages=[...]` when the session is created, interleaved in one run on this machine. The
package comes from an index on 127.0.0.1 (tests/package_index.py), built and cached by a warm-up
of each path first, so both sides measure the cached case:

- create: `scheduler.session(packages=["six==1.16.0"])` then `import six` (layer cached; VM from
  the L1 snapshot of that layer once it exists);
- create plain: the same without packages (the baseline both paths pay);
- pip in a subprocess: `subprocess.run(["pip", "install", "six==1.16.0"])` then `import six`, one
  exec in an open plain session (the archive cached on the host);
- %pip: the notebook line in the REPL itself (no interpreter start);
and, once, the first `pip install` with nothing cached (the warm-up's).

    .venv/bin/python bench/installs.py --runs 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.package_index

from common import percentile, summary

from exec_sandbox import Scheduler, SchedulerConfig
from tests.package_index import LocalIndex, make_wheel

SIX = "six==1.16.0"
SUBPROCESS = (
    "import subprocess\n"
    f"r = subprocess.run(['pip', 'install', '{SIX}'], capture_output=True, text=True)\n"
    "assert r.returncode == 0, r.stderr\nimport six"
)
MAGIC = f"%pip install -q {SIX}\nimport six"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sbx-bench-installs-") as tmp:
        root = Path(tmp)
        (root / "dists").mkdir()
        with LocalIndex(root / "index") as index:
            index.publish(make_wheel(root / "dists", "six", "1.16.0", {"six.py": "X = 1\n"}))
            os.environ.update(index.pip_env())
            config = SchedulerConfig(
                package_cache_dir=root / "packages",
                memory_snapshot_cache_dir=root / "memory",
                max_concurrent_vms=3,
            )
            async with Scheduler(config) as sched:
                await run(sched, args.runs)


async def run(sched: Scheduler, runs: int) -> None:
    # Warm-up: builds the layer, the archive and both L1 snapshots.
    for packages in ([SIX], None):
        async with await sched.session(language="python", packages=packages) as s:
            await s.exec("import sys")
    async with await sched.session(language="python") as s:
        at = time.perf_counter()
        warm = await s.exec(SUBPROCESS, timeout_seconds=120)
        cold = (time.perf_counter() - at) * 1000
        assert warm.exit_code == 0, warm.stderr
    await sched.wait_snapshots(300)
    for packages in ([SIX], None):
        await sched.prepare_snapshot("python", packages=packages)
    create: list[float] = []
    plain: list[float] = []
    sub: list[float] = []
    magic: list[float] = []
    for _ in range(runs):  # interleaved: every path sees the same load
        at = time.perf_counter()
        async with await sched.session(language="python", packages=[SIX]) as s:
            r = await s.exec("import six")
            create.append((time.perf_counter() - at) * 1000)
            assert r.exit_code == 0 and s.l1_cache_hit, r.stderr
        at = time.perf_counter()
        async with await sched.session(language="python") as s:
            await s.exec("pass")
            plain.append((time.perf_counter() - at) * 1000)
        for code, out in ((SUBPROCESS, sub), (MAGIC, magic)):
            async with await sched.session(language="python") as s:
                at = time.perf_counter()
                r = await s.exec(code, timeout_seconds=120)
                out.append((time.perf_counter() - at) * 1000)
                assert r.exit_code == 0, r.stderr
    print(
        f"first pip install (nothing cached: resolve, download, unpack, compile, pack): "
        f"{cold:.0f} ms"
    )
    print(f"session(packages=[six]) + import:  {summary(create)}")
    print(f"session() plain + empty exec:      {summary(plain)}")
    print(f"pip install (subprocess) + import: {summary(sub)}")
    print(f"%pip install + import (in REPL):   {summary(magic)}")
    base = percentile(create, 50)
    print(
        f"pip subprocess / create with packages = {percentile(sub, 50) / base:.2f}x, "
        f"%pip / create with packages = {percentile(magic, 50) / base:.2f}x "
        "(target <= 2x and < 1000 ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())
