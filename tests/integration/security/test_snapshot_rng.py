"""VMs restored from one memory snapshot must not share RNG output: the host reseeds each
clone's kernel CRNG (RESEED) before any code runs. Checked from inside the guests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm

PROGRAMS = {
    "python": "import os; print(os.urandom(16).hex())",
    "javascript": "console.log(require('crypto').randomBytes(16).toString('hex'))",
    "raw": "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo",
}


@pytest.mark.parametrize("language", ["python", "javascript", "raw"])
async def test_clones_of_one_snapshot_draw_different_random_bytes(
    images_ready: None, tmp_path: Path, language: str
) -> None:
    config = SchedulerConfig(memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=4)
    async with Scheduler(config) as sched:
        assert await sched.prepare_snapshot(language)  # type: ignore[arg-type]
        results = [
            await sched.run(PROGRAMS[language], language=language)  # type: ignore[arg-type]
            for _ in range(2)
        ]
    assert all(r.l1_cache_hit for r in results), "both runs must come from the snapshot"
    a, b = (r.stdout.strip() for r in results)
    assert len(a) == 32 and len(b) == 32, (a, b)
    assert a != b
    assert qemu_processes(parent=os.getpid()) == []
