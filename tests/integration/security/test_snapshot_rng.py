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
    # The python template holds a parked interpreter (snapshots.TEMPLATE_PRESTART_LANGUAGES):
    # its `random` and `secrets` must be seeded after the clone's RESEED too, and argv[1] "-c"
    # shows that the parked interpreter is the one that ran the code.
    "python": "import os, random, secrets\n"
              "argv1 = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode()\n"
              "print(argv1, os.urandom(16).hex(), secrets.token_hex(16), '%032x' % random.getrandbits(128))",
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
    a, b = (r.stdout.split() for r in results)
    if language == "python":
        assert a[0] == b[0] == "-c", (a, b)
        a, b = a[1:], b[1:]
    assert all(len(x) == 32 for x in a + b), (a, b)
    for mine, theirs in zip(a, b, strict=True):  # each source on its own
        assert mine != theirs, (a, b)
    assert qemu_processes(parent=os.getpid()) == []
