"""Node's startup snapshot in real microVMs (docs/design.md, "JavaScript start-up"): for an
image whose node lacks node's built-in one (Debian's builds), a javascript template builds it,
its clones start node from it, and what the code sees is what a cold run (node without it) sees,
apart from process.execArgv. For an image whose node has its own (the default image's node 22),
none is built, kept or given, and clones and pooled VMs start node as a cold run does."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.snapshots.node_startup import NODE_SNAPSHOT_PATH
from tests.helpers import node_blob_wanted, qemu_processes

pytestmark = pytest.mark.vm


BLOB_WANTED = node_blob_wanted()
blob_images_only = pytest.mark.skipif(
    not BLOB_WANTED, reason="the images' node has its own startup snapshot: no blob is made"
)
# What a clone's node has in execArgv: the blob, or nothing (as a cold run).
FROM_CLONE = f"--snapshot-blob {NODE_SNAPSHOT_PATH}\n" if BLOB_WANTED else "\n"

# Script identity, resolution (CommonJS and ESM, a missing relative module), the exit status.
SCRIPT = (
    "const path = require('path');\n"
    "console.log(JSON.stringify([process.argv.slice(1), __filename, require.main === module,\n"
    "  module.paths.slice(0, 2), typeof require('fs').readFileSync,\n"
    "  new (require('console').Console)(process.stdout) instanceof console.Console]));\n"
    "try { require('./missing'); } catch (e) { console.log(e.code, e.message.split('\\n')[0]); }\n"
    "import('node:path').then((m) => { console.log(m.default === path); process.exit(4); });\n"
)
CRASH = "function f() { throw new Error('boom'); }\nf();\n"
FLAGS = "console.log(process.execArgv.join(' '));\n"


async def test_l1_javascript_runs_start_from_the_snapshot_and_behave_like_cold_runs(
    images_ready: None, tmp_path: Path
) -> None:
    config = SchedulerConfig(memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=4)
    async with Scheduler(config) as sched:
        # Another memory size: no template of it exists, so these boot cold, without the blob.
        cold = [
            await sched.run(code, language="javascript", memory_mb=256)
            for code in (FLAGS, SCRIPT, CRASH)
        ]
        assert await sched.prepare_snapshot("javascript")
        warm = [await sched.run(code, language="javascript") for code in (FLAGS, SCRIPT, CRASH)]
        # A session opened from a clone: its REPL driver is the node parked in the template
        # (started from the snapshot too; its cmdline has the pre-start preload).
        async with await sched.session(language="javascript") as session:
            in_session = await session.exec(FLAGS)
            adopted = await session.exec(
                "console.log(require('fs').readFileSync("
                "'/proc/self/cmdline', 'latin1').split('\\0')"
                ".some((a) => a.endsWith('/prestart.js')))"
            )
    assert not any(r.l1_cache_hit for r in cold) and all(r.l1_cache_hit for r in warm)
    assert cold[0].stdout == "\n", cold[0]
    assert warm[0].stdout == FROM_CLONE, warm[0]
    assert in_session.stdout == FROM_CLONE, in_session
    assert adopted.stdout == "true\n", adopted
    for mine, theirs in zip(warm[1:], cold[1:], strict=True):
        assert (mine.stdout, mine.stderr, mine.exit_code) == (
            theirs.stdout,
            theirs.stderr,
            theirs.exit_code,
        )
    assert warm[1].exit_code == 4 and warm[1].stdout.endswith(
        "MODULE_NOT_FOUND Cannot find module './missing'\ntrue\n"
    )
    assert warm[2].exit_code == 1 and "Error: boom" in warm[2].stderr
    assert "at Object.<anonymous> (/run/sbx/main.js:2:1)" in warm[2].stderr, warm[2].stderr
    # A blob is kept for the machine only when the image's node wants one.
    assert bool(list(tmp_path.glob("node-startup-*.blob"))) == BLOB_WANTED
    assert qemu_processes(parent=os.getpid()) == []


async def test_pool_vms_cloned_from_a_javascript_template_park_node_from_the_snapshot(
    images_ready: None, tmp_path: Path
) -> None:
    # The pre-started interpreter's bootstrap uses console.Console, which node 18 deserialises
    # as undefined unless the entry script puts it back (node_startup._NODE_SNAPSHOT_ENTRY).
    # Without a blob (node 22) the pooled VMs cloned from the template run the same way.
    config = SchedulerConfig(
        memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=4, warm_pool_size={"javascript": 1}
    )
    who = "console.log(process.execArgv[0] === '--snapshot-blob');"
    async with Scheduler(config) as sched:
        assert await sched.prepare_snapshot("javascript")
        hits = []
        for _ in range(3):  # the first pooled VM may predate the template
            await sched.wait_pool_ready(timeout=300)
            hits.append(await sched.run(who + CRASH, language="javascript"))
    assert all(r.warm_pool_hit for r in hits), hits
    from_clone = [r for r in hits if r.stdout == "true\n"]
    assert bool(from_clone) == BLOB_WANTED, [r.stdout for r in hits]
    assert all(r.exit_code == 1 and "Error: boom" in r.stderr for r in hits), hits
    assert qemu_processes(parent=os.getpid()) == []


DRAWS = (
    "const c = require('crypto');\n"
    "console.log(JSON.stringify([process.execArgv, Math.random(), c.randomUUID(),\n"
    "  c.randomBytes(16).toString('hex')]));\n"
)


@blob_images_only
async def test_cold_javascript_vms_start_node_from_the_machines_snapshot_or_refuse_it(
    images_ready: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The blob a template left in the cache directory is written into cold-booted VMs (here
    # with memory snapshots off), whose node then starts from it with randomness of its own; a
    # blob whose CPU tag is not the guest's is refused, dropped, and node starts without it.
    async with Scheduler(SchedulerConfig(memory_snapshot_cache_dir=tmp_path)) as sched:
        assert await sched.prepare_snapshot("javascript")
    (blob,) = tmp_path.glob("node-startup-*.blob")
    cold_config = SchedulerConfig(
        memory_snapshot_cache_dir=tmp_path, memory_snapshots=False, max_concurrent_vms=4
    )
    async with Scheduler(cold_config) as sched:
        runs = [await sched.run(DRAWS, language="javascript") for _ in range(2)]
        crash = await sched.run(CRASH, language="javascript")
        # The host keeps a SHA-256 in front of what the guest sent (tag, then blob): flip a
        # bit within the tag, as another CPU's feature set would differ, and keep the file
        # intact for the host, so that the guest is the one to refuse it.
        data = bytearray(blob.read_bytes()[32:])
        data[20] ^= 1
        blob.write_bytes(hashlib.sha256(data).digest() + bytes(data))
        refused = await sched.run(DRAWS, language="javascript")
    seen = [json.loads(r.stdout) for r in runs]
    assert all(r.exit_code == 0 and not r.l1_cache_hit for r in runs), runs
    assert all(s[0] == ["--snapshot-blob", NODE_SNAPSHOT_PATH] for s in seen), seen
    for a, b in zip(seen[0][1:], seen[1][1:], strict=True):
        assert a != b, seen  # Math.random, randomUUID, randomBytes: each VM its own
    assert crash.exit_code == 1 and "at Object.<anonymous> (/run/sbx/main.js:2:1)" in crash.stderr
    assert refused.exit_code == 0 and json.loads(refused.stdout)[0] == [], refused
    assert "refused by the VM" in caplog.text  # by the guest, not dropped as damaged
    assert not blob.exists()
    assert qemu_processes(parent=os.getpid()) == []
