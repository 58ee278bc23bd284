"""First (cold boot) and L1 (restored clone) start of the guest's interpreters: the images of
this checkout (python 3.13, node 22) against a baseline images directory (python 3.11, node 18:
the images before the move), both in one process and interleaved per round, so that the ratio
new / old carries across the machine's load swings. Also TypeScript (`language="typescript"`)
against plain JavaScript on the new images: what stripping types costs a run.

    .venv/bin/python bench/runtimes.py --old /path/to/old-images --runs 8

Each images directory needs its manifest.json; the old one may be a directory of hard links to
an earlier build's kernel and root image (their manifest naming those paths)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from common import config, percentile, timed

from exec_sandbox import Scheduler
from exec_sandbox.images.catalog import load_images
from exec_sandbox.paths import images_dir

CODE = {
    "python": "import sys; print(sys.version_info[:2])",
    "javascript": "console.log(process.versions.node)",
}
TS_CODE = "interface P { x: number }\nconst p: P = { x: 1 };\nconsole.log(p.x as number);\n"
TS_ENUM = "enum C { A, B }\nconsole.log(C.B);\n"


@contextlib.asynccontextmanager
async def schedulers(images: Path, work: Path) -> AsyncIterator[tuple[Scheduler, Scheduler]]:
    """(cold, l1) for one images directory: memory snapshots off, and on with a cache of its own."""
    cold_config = config(work / "cold", images_dir=images, memory_snapshots=False)
    l1_config = config(work / "l1", images_dir=images)
    async with Scheduler(cold_config) as cold, Scheduler(l1_config) as l1:
        yield cold, l1


async def run_ms(sched: Scheduler, code: str, language: str, *, l1: bool) -> float:
    ms, result = await timed(lambda: sched.run(code, language=language))  # type: ignore[arg-type]
    assert result.exit_code == 0, (language, result.stderr)  # type: ignore[attr-defined]
    assert result.l1_cache_hit == l1, result  # type: ignore[attr-defined]
    return ms


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", type=Path, required=True, help="baseline images directory")
    parser.add_argument("--new", type=Path, default=images_dir(), help="images under test")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    sets = {"old": args.old, "new": args.new}
    for name, where in sets.items():
        facts = load_images(where).guest
        print(f"{name}: {where} python {facts and facts.python} node {facts and facts.node}")
    samples: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-runtimes-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            scheds = {
                name: await stack.enter_async_context(schedulers(where, Path(tmp) / name))
                for name, where in sets.items()
            }
            for name, (_, l1) in scheds.items():
                for language in CODE:
                    assert await l1.prepare_snapshot(language), (name, language)  # type: ignore[arg-type]
            for _ in range(args.runs):
                order = [(n, lang) for n in sets for lang in CODE]
                random.shuffle(order)
                for name, language in order:
                    cold, l1 = scheds[name]
                    code = CODE[language]
                    samples.setdefault((name, language, "first"), []).append(
                        await run_ms(cold, code, language, l1=False)
                    )
                    samples.setdefault((name, language, "L1"), []).append(
                        await run_ms(l1, code, language, l1=True)
                    )
                _, new_l1 = scheds["new"]
                new_cold, _ = scheds["new"]
                for label, code in (("ts", TS_CODE), ("ts-enum", TS_ENUM)):
                    samples.setdefault(("new", label, "L1"), []).append(
                        await run_ms(new_l1, code, "typescript", l1=True)
                    )
                    samples.setdefault(("new", label, "first"), []).append(
                        await run_ms(new_cold, code, "typescript", l1=False)
                    )
    print(f"\n{'what':34s} {'old p50':>9s} {'new p50':>9s} {'new/old':>8s}   (ms, n={args.runs})")
    for language in CODE:
        for tier in ("first", "L1"):
            old = percentile(samples[("old", language, tier)], 50)
            new = percentile(samples[("new", language, tier)], 50)
            print(f"{language + ' ' + tier:34s} {old:9.1f} {new:9.1f} {new / old:7.2f}x")
    print(f"\n{'TypeScript on the new images':34s} {'p50':>9s} {'/ js p50':>9s}")
    for label in ("ts", "ts-enum"):
        for tier in ("first", "L1"):
            ts = percentile(samples[("new", label, tier)], 50)
            js = percentile(samples[("new", "javascript", tier)], 50)
            print(f"{label + ' ' + tier:34s} {ts:9.1f} {ts / js:8.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
