"""Host tools and rich outputs, each against a baseline measured in the same session and run,
interleaved:

* a host tool call from python code: `session.exec` of N calls of `tools.echo(i)` against the
  same exec with N plain function calls in the guest; the difference over N is one call's round
  trip (guest runtime -> agent's host socket -> TOOL_CALL -> the host's function -> TOOL_RESULT);
* a rich output: `display()` of an object whose PNG is 1 MiB against `session.read_file` of a
  1 MiB file from the same VM (the file transfer path of the same channel).

    .venv/bin/python bench/host_tools.py --runs 20 --calls 50
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary, timed

from exec_sandbox import Scheduler

ONE_MIB = 1024 * 1024

SHOW = f"""
class _Blob:
    def _repr_png_(self):
        return b"\\x89PNG" + bytes({ONE_MIB - 4})
display(_Blob())
"""


def echo(value: object) -> object:
    return value


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50, help="tool calls per exec")
    args = parser.parse_args()
    n = args.calls
    with_tools = f"for i in range({n}):\n    tools.echo(i)\n"
    without = f"def _echo(v):\n    return v\nfor i in range({n}):\n    _echo(i)\n"
    async with (
        Scheduler() as scheduler,
        await scheduler.session(language="python", tools={"echo": echo}) as session,
    ):
        await session.exec(f"open('blob.bin', 'wb').write(bytes({ONE_MIB}))")
        await session.exec(with_tools + without + SHOW)  # warm: the runtime's first import
        calls: list[float] = []
        plain: list[float] = []
        shows: list[float] = []
        reads: list[float] = []
        for _ in range(args.runs):
            ms, _result = await timed(lambda: session.exec(with_tools))
            calls.append(ms)
            ms, _result = await timed(lambda: session.exec(without))
            plain.append(ms)
            ms, result = await timed(lambda: session.exec(SHOW))
            assert len(result.outputs[0].data) == ONE_MIB  # type: ignore[union-attr]
            shows.append(ms)
            ms, _result = await timed(lambda: session.read_file("blob.bin"))
            reads.append(ms)
    per_call = (percentile(calls, 50) - percentile(plain, 50)) / n
    print(f"exec with {n} tool calls:     {summary(calls)}")
    print(f"exec with {n} local calls:    {summary(plain)}")
    print(f"one tool call (p50 difference / {n}): {per_call:.2f} ms")
    print(f"display() of a 1 MiB PNG:     {summary(shows)}")
    print(f"read_file of 1 MiB:           {summary(reads)}")
    ratio = percentile(shows, 50) / percentile(reads, 50)
    print(f"ratio display / read_file (p50): {ratio:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
