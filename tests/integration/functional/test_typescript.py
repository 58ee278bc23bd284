"""TypeScript in real microVMs (docs/design.md, "TypeScript"): `language="typescript"` and "ts"
run in the javascript runtime, JavaScript code may carry type annotations, and errors point at
the user's own lines, in one-shot runs (cold, from an L1 clone, from a pooled VM's pre-started
node) and in session cells; `sbx run x.ts`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm

# Interfaces, generics, a type-only import, a union type, a cast and an enum (transformed:
# node's strip mode refuses enums), then a throw on line 13.
PROGRAM = """import type { Readable } from "node:stream";
interface Point { x: number; y: number }
function add<T extends Point>(a: T, b: T): Point {
  return { x: a.x + b.x, y: a.y + b.y };
}
enum Color { Red, Green }
const p: Point = add({ x: 1, y: 2 }, { x: 3, y: 4 });
let stream: Readable | undefined = undefined;
const n = (p.x as number) + p.y;
console.log(JSON.stringify(p), n, stream === undefined, Color[Color.Green]);
function fail(why: string): never {
  throw new Error(why);
}
fail("boom");
"""
# The throw is on line 12 (inside fail, called on line 14).
THROW_AT = ":12:"
# Without an enum node strips in place: the columns stay the user's too.
STRIPPED = """interface Box<T> { value: T }
const b: Box<string> = { value: "ok" };
function first<T>(items: T[]): T | undefined { return items[0]; }
console.log(b.value, first<number>([7, 8]));
throw new Error(`bad ${b.value}`);
"""
# A TypeScript syntax error on line 3, after types V8 cannot parse on line 1.
TS_SYNTAX_ERROR = "interface A { a: number }\nconst v: A = { a: 1 };\nlet y: number = ;\n"
# A JavaScript syntax error keeps V8's own message and line.
JS_SYNTAX_ERROR = "const a = 1;\nlet x = ;\n"
# A module with types (import declarations: node loads it as ESM).
ESM = 'import { sep } from "node:path";\nconst s: string = sep;\nconsole.log("esm", s);\n'


def _check_program(stdout: str, stderr: str, exit_code: int, path: str) -> None:
    assert stdout == '{"x":4,"y":6} 10 true Green\n', (stdout, stderr)
    assert exit_code == 1
    assert "Error: boom" in stderr, stderr
    assert f"{path}{THROW_AT}" in stderr, stderr
    assert "ExperimentalWarning" not in stderr, stderr


@pytest.mark.parametrize("language", ["typescript", "ts", "javascript"])
async def test_typescript_runs_under_every_name_with_the_users_line_numbers(
    scheduler: Scheduler, language: str
) -> None:
    result = await scheduler.run(PROGRAM, language=language)  # type: ignore[arg-type]
    _check_program(result.stdout, result.stderr, result.exit_code, "/run/sbx/main.js")

    stripped = await scheduler.run(STRIPPED, language=language)  # type: ignore[arg-type]
    assert stripped.stdout == "ok 7\n", stripped
    assert "at Object.<anonymous> (/run/sbx/main.js:5:7)" in stripped.stderr, stripped.stderr


async def test_syntax_errors_point_at_the_users_line(scheduler: Scheduler) -> None:
    ts = await scheduler.run(TS_SYNTAX_ERROR, language="typescript")
    assert ts.exit_code == 1 and ts.stdout == ""
    assert ts.stderr.startswith("/run/sbx/main.js:3\n"), ts.stderr
    assert "SyntaxError" in ts.stderr
    js = await scheduler.run(JS_SYNTAX_ERROR, language="javascript")
    assert js.exit_code == 1
    assert js.stderr.startswith("/run/sbx/main.js:2\n"), js.stderr
    assert "SyntaxError: Unexpected token ';'" in js.stderr, js.stderr


async def test_modules_with_and_without_types_run(scheduler: Scheduler) -> None:
    typed = await scheduler.run(ESM, language="ts")
    assert (typed.stdout, typed.exit_code) == ("esm /\n", 0), typed
    plain = await scheduler.run(
        'import { sep } from "node:path";\nconsole.log(await Promise.resolve(sep));\n',
        language="javascript",
    )
    assert (plain.stdout, plain.stderr, plain.exit_code) == ("/\n", "", 0), plain
    # A top-level await alone makes node run the code as a module too (no stripper needed).
    awaited = await scheduler.run(
        "const v: number = await Promise.resolve(5);\nconsole.log(v);", language="typescript"
    )
    assert (awaited.stdout, awaited.stderr, awaited.exit_code) == ("5\n", "", 0), awaited
    untyped = await scheduler.run("console.log(await Promise.resolve(6));", language="javascript")
    assert (untyped.stdout, untyped.stderr, untyped.exit_code) == ("6\n", "", 0), untyped


async def test_session_cells_take_typescript(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="typescript") as session:
        assert session.language == "javascript"  # the runtime: TypeScript is one of its names
        first = await session.exec(
            "interface P { x: number }\nconst p: P = { x: 1 };\n"
            "function id<T>(v: T): T { return v; }\nconsole.log(id<number>(p.x));"
        )
        enum = await session.exec("enum C { A, B }\nconsole.log(C.B, C[1]);")
        later = await session.exec("console.log(p.x + C.B);")  # state kept across cells
        awaited = await session.exec("const q: number = await Promise.resolve(3);\nconsole.log(q);")
        thrown = await session.exec("let z: number = 1;\n\nthrow new Error('at3');")
        syntax = await session.exec("let w: number = 1;\nlet v: string = ;")
        alive = await session.exec("console.log('alive', z);")
    assert (first.stdout, first.exit_code) == ("1\n", 0), first
    assert (enum.stdout, enum.exit_code) == ("1 B\n", 0), enum
    assert later.stdout == "2\n", later
    assert awaited.stdout == "3\n", awaited
    assert thrown.exit_code == 1 and "at session:3:" in thrown.stderr, thrown.stderr
    assert syntax.exit_code == 1 and syntax.stderr.startswith("session:2\n"), syntax.stderr
    assert alive.stdout == "alive 1\n", alive


async def test_typescript_from_l1_clones_and_pooled_vms(images_ready: None, tmp_path: Path) -> None:
    # A clone's node and a pooled VM's pre-started node load the code through the same hook
    # (installed by the pre-start preload before the VM was parked or snapshotted).
    config = SchedulerConfig(memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=4)
    async with Scheduler(config) as sched:
        assert await sched.prepare_snapshot("javascript")
        restored = await sched.run(PROGRAM, language="typescript")
    pooled_config = SchedulerConfig(
        memory_snapshot_cache_dir=tmp_path, max_concurrent_vms=4, warm_pool_size={"javascript": 1}
    )
    async with Scheduler(pooled_config) as sched:
        await sched.wait_pool_ready(timeout=300)
        pooled = await sched.run(PROGRAM, language="ts")
    assert restored.l1_cache_hit, restored
    _check_program(restored.stdout, restored.stderr, restored.exit_code, "/run/sbx/main.js")
    assert pooled.warm_pool_hit, pooled
    _check_program(pooled.stdout, pooled.stderr, pooled.exit_code, "/run/sbx/main.js")
    assert qemu_processes(parent=os.getpid()) == []


def test_sbx_run_takes_a_ts_file(images_ready: None, tmp_path: Path) -> None:
    script = tmp_path / "app.ts"
    script.write_text(STRIPPED)
    proc = subprocess.run(
        [sys.executable, "-m", "exec_sandbox.cli.main", "run", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "ok 7\n"
    assert "main.js:5:7" in proc.stderr, proc.stderr
