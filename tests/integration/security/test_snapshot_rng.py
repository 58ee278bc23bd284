"""VMs restored from one memory snapshot must not share RNG output: the host reseeds each clone's
kernel CRNG (RESEED) before any code runs, and what a template leaves in user space (a parked
python, a parked node and its startup snapshot) holds no RNG state a clone's code sees: python
seeds none before the code runs, node makes its own fresh at the go. Checked from inside the
guests, three clones each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from tests.helpers import node_blob_wanted, qemu_processes

pytestmark = pytest.mark.vm
# The image's node lacks a built-in startup snapshot: clones start it from a user-land blob.
BLOB = node_blob_wanted()

# What node draws, in a run and in a session alike: whether the code runs in the parked node
# (the pre-start preload's "-r" in its cmdline) and its pid, then each generator: the main
# context's Math.random, a new context's (seeded from V8's isolate generator), OpenSSL's
# (randomBytes, randomUUID, getRandomValues), and `pooled`, drawn by the callback form of
# randomBytes on a libuv pool thread, whose DRBGs reseed from the primary.
JS_DRAWS = (
    "const c = require('crypto');\n"
    "const hex = (b) => Buffer.from(b).toString('hex');\n"
    # Parked: started with the pre-start preload (a cold node has tools_global.js as its -r).
    "const parked = require('fs').readFileSync('/proc/self/cmdline').toString().split('\\0')\n"
    "  .some((a) => a.endsWith('/prestart.js')) ? '-r' : 'spawned';\n"
    "const draws = (pooled) => [parked, process.pid, Math.random(),\n"
    "  require('vm').runInNewContext('Math.random()'), hex(c.randomBytes(16)), c.randomUUID(),\n"
    "  hex(c.getRandomValues(new Uint8Array(16))), hex(pooled)].join(' ');\n"
)

PROGRAMS = {
    # The python template holds a parked interpreter (snapshots.TEMPLATE_PRESTART_LANGUAGES):
    # its `random` and `secrets` must be seeded after the clone's RESEED too, and argv[1] "-c"
    # shows that the parked interpreter is the one that ran the code.
    "python": "import os, random, secrets\n"
    "argv1 = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode()\n"
    "print(argv1, os.urandom(16).hex(), secrets.token_hex(16), '%032x' % random.getrandbits(128))",
    # The javascript template holds a parked node too (started from a user-land startup blob when
    # the image's node lacks a built-in one): every clone runs the code in that one process (one
    # pid in all clones, the blob in execArgv or no flags at all), so each of node's generators
    # must have been made fresh at its go (guest/node/node_reseed.c); an ed25519 key on top.
    "javascript": JS_DRAWS + "const key = c.generateKeyPairSync('ed25519').publicKey\n"
    "  .export({format: 'der', type: 'spki'}).subarray(-32);\n"
    "c.randomBytes(16, (err, pooled) => console.log(draws(pooled),\n"
    "  process.execArgv.join(',') || '-', hex(key)));",
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
            for _ in range(3)
        ]
    assert all(r.l1_cache_hit for r in results), "every run must come from the snapshot"
    draws = [r.stdout.split() for r in results]
    if language == "python":
        assert all(d[0] == "-c" for d in draws), draws
        draws = [d[1:] for d in draws]
        assert all(len(x) == 32 for d in draws for x in d), draws
    elif language == "javascript":
        assert all(d[0] == "-r" for d in draws), draws
        assert len({d[1] for d in draws}) == 1, f"not one parked process: {draws}"
        # node's flags: the user-land startup blob, for an image whose node lacks its own
        assert all(
            d[8] == ("--snapshot-blob,/tmp/.sbx-node-startup.blob" if BLOB else "-") for d in draws
        ), draws
        draws = [d[2:8] + d[9:] for d in draws]
        assert all(len(d) == 7 for d in draws), draws
    else:
        assert all(len(x) == 32 for d in draws for x in d), draws
    for source in zip(*draws, strict=True):  # each source on its own: all clones differ
        assert len(set(source)) == len(source), draws
    assert qemu_processes(parent=os.getpid()) == []


# A session started from a clone takes the parked node as its REPL driver (go "4"): the same
# generators, drawn from the REPL after the hand-over.
SESSION_JS = JS_DRAWS + (
    "console.log(draws(await new Promise((resolve) => c.randomBytes(16, (e, b) => resolve(b)))));"
)


async def test_javascript_sessions_of_one_snapshot_draw_different_random_bytes(
    images_ready: None, tmp_path: Path
) -> None:
    config = SchedulerConfig(memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=4)
    draws = []
    async with Scheduler(config) as sched:
        assert await sched.prepare_snapshot("javascript")
        for _ in range(3):
            async with await sched.session(language="javascript") as session:
                result = await session.exec(SESSION_JS)
                assert result.exit_code == 0, result
                draws.append(result.stdout.split())
    assert all(d[0] == "-r" for d in draws), draws
    assert len({d[1] for d in draws}) == 1, f"not one parked process: {draws}"
    draws = [d[2:] for d in draws]
    assert all(len(d) == 6 for d in draws), draws
    for source in zip(*draws, strict=True):
        assert len(set(source)) == len(source), draws
    assert qemu_processes(parent=os.getpid()) == []
