"""`sbx mcp` overhead, against a baseline in the same run: the round trip of a session's
`exec("print(1)")` as an MCP tool call (the official client over stdio to a `sbx mcp`
subprocess: JSON-RPC, the SDK's dispatch, rendering the result) and as a direct
`Session.exec()` in this process. Each side has its own VM of the same configuration; what
differs is the MCP path.

    .venv/bin/python bench/mcp_calls.py --runs 100
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp_types import CallToolResult, TextContent

from exec_sandbox import Scheduler, SchedulerConfig

CODE = "print(1)"


async def direct(runs: int) -> list[float]:
    config = SchedulerConfig(max_concurrent_vms=2, memory_snapshots=False)
    async with Scheduler(config) as scheduler, await scheduler.session(language="python") as s:
        await s.exec(CODE)  # the first exec warms the REPL
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            await s.exec(CODE)
            times.append((time.perf_counter() - started) * 1000)
        return times


async def over_mcp(runs: int) -> list[float]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "exec_sandbox.cli.main", "mcp", "--max-vms", "2", "--no-memory-snapshots"],
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        opened = await session.call_tool("open_session", {"language": "python"})
        assert isinstance(opened, CallToolResult) and isinstance(opened.content[0], TextContent)
        sid = opened.content[0].text.splitlines()[0].removeprefix("session_id: ")
        arguments = {"session_id": sid, "code": CODE}
        await session.call_tool("exec", arguments)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            result = await session.call_tool("exec", arguments)
            times.append((time.perf_counter() - started) * 1000)
            assert isinstance(result, CallToolResult) and not result.is_error
        return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    base = await direct(args.runs)
    mcp = await over_mcp(args.runs)
    print(f"Session.exec() in process   {summary(base)}")
    print(f"exec tool over MCP stdio    {summary(mcp)}")
    p50_base, p50_mcp = percentile(base, 50), percentile(mcp, 50)
    print(f"p50 ratio {p50_mcp / p50_base:.2f}x (+{p50_mcp - p50_base:.1f} ms)")


if __name__ == "__main__":
    asyncio.run(main())
