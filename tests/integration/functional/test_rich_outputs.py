"""Host tools and rich outputs end to end in real microVMs: the guest runtime (guest/runtime/:
python's `tools` and `display` built-ins and matplotlib backend, node's `tools` global) through
the agent's host socket to `tools={...}`, `ExecutionResult.outputs` and `tool_calls`
(docs/protocol.md, "Host tools and rich outputs")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from exec_sandbox import Output, Scheduler, SchedulerConfig
from tests.helpers import MATPLOTLIB, PACKAGE_TIMEOUT_SECONDS, PANDAS, qemu_processes

pytestmark = pytest.mark.vm


HTML_OBJECT = """
class Table:
    def _repr_html_(self):
        return "<table><tr><td>1</td></tr></table>"
    def __repr__(self):
        return "Table()"
"""


def _add(a: int, b: int) -> int:
    return a + b


async def test_a_sessions_last_expression_is_an_output_not_stdout(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        result = await session.exec("x = 1\n1 + x")
        assert (result.stdout, result.exit_code) == ("", 0)
        assert result.outputs == [Output("text/plain", "2")]
        # None, a statement and "value;" show nothing; what the code printed stays stdout.
        result = await session.exec("print('p')\nx;")
        assert (result.stdout, result.outputs) == ("p\n", [])


async def test_display_of_an_object_with_repr_html(scheduler: Scheduler) -> None:
    result = await scheduler.run(HTML_OBJECT + "display(Table())\nprint('after')")
    assert (result.stdout, result.exit_code) == ("after\n", 0), result.stderr
    assert result.outputs == [
        Output("text/html", "<table><tr><td>1</td></tr></table>"),
        Output("text/plain", "Table()"),
    ]


async def test_display_and_tools_in_a_run_that_is_not_prestarted(scheduler: Scheduler) -> None:
    # Env variables make the agent start a fresh python (docs/protocol.md, PRESTART): the
    # built-ins come from the runtime's .pth file there too.
    result = await scheduler.run(
        "display(40 + 2)\nprint(tools.add(1, 2))", env_vars={"A": "1"}, tools={"add": _add}
    )
    assert (result.stdout, result.exit_code) == ("3\n", 0), result.stderr
    assert result.outputs == [Output("text/plain", "42")]


async def test_a_run_calls_a_sync_and_an_async_host_tool(scheduler: Scheduler) -> None:
    async def lookup(key: str, *, default: str = "none") -> dict[str, str]:
        await asyncio.sleep(0.01)
        return {"key": key, "value": default}

    result = await scheduler.run(
        "print(tools.add(2, 3))\nprint(tools.lookup('k', default='v'))",
        tools={"add": _add, "lookup": lookup},
    )
    assert (result.stdout, result.exit_code) == ("5\n{'key': 'k', 'value': 'v'}\n", 0), (
        result.stderr
    )
    assert [(c.name, c.ok) for c in result.tool_calls] == [("add", True), ("lookup", True)]


async def test_a_tool_that_raises_is_a_tool_error_in_the_guest(scheduler: Scheduler) -> None:
    def boom(what: str) -> None:
        raise ValueError(f"no luck with {what}")

    code = (
        "from exec_sandbox_guest import ToolError\n"
        "try:\n"
        "    tools.boom('x')\n"
        "except ToolError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    result = await scheduler.run(code, tools={"boom": boom})
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("ToolError ") and "no luck with x" in result.stdout
    [call] = result.tool_calls
    assert (call.name, call.ok) == ("boom", False)
    assert call.error is not None and "no luck with x" in call.error


async def test_a_call_the_timeout_cuts_short_is_logged_as_cancelled(scheduler: Scheduler) -> None:
    async def slow() -> str:
        await asyncio.sleep(30)
        return "never"

    result = await scheduler.run("tools.slow()", timeout_seconds=2, tools={"slow": slow})
    assert result.exit_code == -1
    (call,) = result.tool_calls
    assert (call.name, call.ok, call.error) == (
        "slow",
        False,
        "cancelled: the execution ended first",
    )
    # It ran until the timeout ended the execution, not cut at once. How much of the 2 s it had
    # depends on when the interpreter reached it, late on a loaded host (1.43 s once).
    assert call.duration_ms >= 500


async def test_node_awaits_a_host_tool_in_a_session(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="javascript", tools={"add": _add}) as session:
        result = await session.exec("const r = await tools.add(1, 2);\nconsole.log(r)")
        assert (result.stdout, result.exit_code) == ("3\n", 0), result.stderr
        result = await session.exec(
            "try { await tools.boom() } catch (e) { console.log(e.name, e.message) }"
        )
        assert result.stdout.startswith("ToolError "), result.stderr


async def test_a_prestarted_node_run_calls_a_host_tool(images_ready: None, tmp_path: Path) -> None:
    # A pool hit runs in the pre-started node, whose preload (guest/repl/prestart.js) defines
    # the global.
    config = SchedulerConfig(
        warm_pool_size={"javascript": 1},
        memory_snapshots=False,
        max_concurrent_vms=2,
        memory_snapshot_cache_dir=tmp_path / "snapshots",
    )
    async with Scheduler(config) as sched:
        await sched.wait_pool_ready(timeout=300)
        result = await sched.run(
            "tools.add(1, 2).then((r) => console.log(r));",
            language="javascript",
            tools={"add": _add},
        )
    assert result.warm_pool_hit
    assert (result.stdout, result.exit_code) == ("3\n", 0), result.stderr
    assert qemu_processes(parent=os.getpid()) == []


async def test_a_cold_node_run_calls_a_host_tool(scheduler: Scheduler) -> None:
    result = await scheduler.run(
        "tools.add(1, 2).then((r) => console.log(r));",
        language="javascript",
        env_vars={"COLD": "1"},  # never the pre-started node (docs/protocol.md, PRESTART)
        tools={"add": _add},
    )
    assert (result.stdout, result.exit_code) == ("3\n", 0), result.stderr


async def test_matplotlib_show_without_savefig_is_one_png(scheduler: Scheduler) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2])\n"
        "plt.title('sandbox')\n"
        "plt.show()\n"
        "print(plt.get_fignums())\n"
    )
    result = await scheduler.run(
        code, packages=[MATPLOTLIB], timeout_seconds=PACKAGE_TIMEOUT_SECONDS
    )
    assert (result.stdout, result.exit_code) == ("[]\n", 0), result.stderr
    assert [o.mime_type for o in result.outputs] == ["image/png"]
    data = result.outputs[0].data
    assert isinstance(data, bytes) and data.startswith(b"\x89PNG\r\n\x1a\n")


async def test_a_pandas_dataframe_as_last_expression(scheduler: Scheduler) -> None:
    async with await scheduler.session(
        language="python", packages=[PANDAS], timeout_seconds=PACKAGE_TIMEOUT_SECONDS
    ) as session:
        result = await session.exec(
            "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"
        )
    assert (result.stdout, result.exit_code) == ("", 0), result.stderr
    assert [o.mime_type for o in result.outputs] == ["text/html", "text/plain"]
    html, plain = (o.data for o in result.outputs)
    assert isinstance(html, str) and "<table" in html and "<td>x</td>" in html
    assert isinstance(plain, str) and plain.split() == ["a", "b", "0", "1", "x", "1", "2", "y"]
