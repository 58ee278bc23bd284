"""Code mode without VMs: how the CodeAct and LlamaIndex integrations turn an agent's tools into
host tools callable by name, and when a session gets the names bound (the real-VM checks are in
tests/integration/integrations/test_codeact.py and test_llamaindex.py)."""

from __future__ import annotations

import asyncio
import builtins
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from exec_sandbox import ExecutionResult
from exec_sandbox.integrations._bridge import Runner
from exec_sandbox.integrations._code_mode import (
    ToolSessions,
    binding_code,
    host_function,
    offered,
    with_binding,
)
from exec_sandbox.integrations._common import SessionPool


class _FakeSession:
    def __init__(self, tools: Mapping[str, Any] | None) -> None:
        self.session_id = uuid.uuid4().hex
        self.tools = tools
        self.closed = False
        self.close_reason = ""
        self.codes: list[str] = []
        self.exit_codes: list[int] = []

    async def exec(self, code: str, **_: Any) -> ExecutionResult:
        self.codes.append(code)
        code_exit = self.exit_codes.pop(0) if self.exit_codes else 0
        return ExecutionResult(stdout="", stderr="boom\n" if code_exit else "", exit_code=code_exit)

    async def close(self) -> None:
        self.closed = True


class _FakeScheduler:
    def __init__(self) -> None:
        self.opened: list[_FakeSession] = []

    async def session(self, **options: Any) -> _FakeSession:
        session = _FakeSession(options.get("tools"))
        self.opened.append(session)
        return session


def _search(query: str) -> str:
    return query


def test_the_binding_line_binds_missing_names_and_leaves_no_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Tools:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: (name, args)

    monkeypatch.setattr(builtins, "tools", Tools(), raising=False)
    line = binding_code("python", ["search", "price"])
    assert line is not None and "\n" not in line
    namespace: dict[str, Any] = {"price": "the code's own"}
    exec(line, namespace)
    assert namespace["search"]("x") == ("search", ("x",))
    assert namespace["price"] == "the code's own"
    assert sorted(k for k in namespace if k != "__builtins__") == ["price", "search"]
    # A one-shot run gets the line in front of the code; bash and no tools get nothing.
    one = binding_code("python", ["search"])
    assert with_binding("python", "print(1)", {"search": _search}) == f"{one}\nprint(1)"
    assert with_binding("raw", "echo 1", {"search": _search}) == "echo 1"
    assert offered("raw", {"search": _search}) is None and offered("python", {}) is None
    assert binding_code("javascript", ["search"]) is not None


def test_sessions_bind_before_the_first_block_and_again_after_a_failed_one() -> None:
    async def go() -> None:
        scheduler = _FakeScheduler()
        sessions = ToolSessions(SessionPool(Runner(scheduler)))  # type: ignore[arg-type]
        tools = {"search": _search}
        binding = binding_code("python", tools)

        async def block(code: str) -> str:
            _, note = await sessions.exec(scheduler, "t1", code, tools, missing="thread id")  # type: ignore[arg-type]
            return note

        assert await block("a = 1") == ""
        (session,) = scheduler.opened
        assert session.tools == tools
        session.exit_codes = [1]
        await block("raise ValueError")
        await block("b = 2")
        assert session.codes == [binding, "a = 1", "raise ValueError", binding, "b = 2"]
        # A binding that fails is said, and tried again next time.
        session.exit_codes = [1]
        await block("c = 3")
        session.exit_codes = [1, 0]
        note = await block("d = 4")
        assert "could not be bound" in note and "boom" in note
        await block("e = 5")
        assert session.codes[-5:] == ["c = 3", binding, "d = 4", binding, "e = 5"]

        # No key: a session of its own, bound, closed, with the note that nothing persists.
        _, note = await sessions.exec(scheduler, None, "f = 6", tools, missing="thread id")  # type: ignore[arg-type]
        alone = scheduler.opened[-1]
        assert alone is not session and alone.closed and alone.codes == [binding, "f = 6"]
        assert "no thread id was given" in note

    asyncio.run(go())


def test_langchain_tools_take_positional_arguments_in_their_schemas_order() -> None:
    pytest.importorskip("langchain_core", reason="the [langchain] extra is not installed")
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int = 2) -> int:
        """Add two numbers."""
        return a + b

    fn = host_function(add)
    assert fn is not None and fn.__name__ == "add"
    assert asyncio.run(fn(1)) == 3 and asyncio.run(fn(1, b=5)) == 6
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        asyncio.run(fn(1, a=2))
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        asyncio.run(fn(1, 2, 3))


def test_codeact_takes_the_callables_of_locals_and_its_own_tools() -> None:
    pytest.importorskip("langgraph_codeact", reason="the [codeact] extra is not installed")
    from exec_sandbox.integrations.codeact import _agent_tools, _given_tools

    async def price(item: str) -> int:
        return len(item)

    given = _given_tools([price], "python")
    found = _agent_tools(
        {"search": _search, "price": None, "bad-name": _search, "data": 3, "Cls": int},
        given,
        "python",
    )
    assert found == {"search": _search, "price": price}
    with pytest.raises(ValueError, match="cannot be called"):
        _given_tools([lambda: 1], "python")


def test_llamaindex_names_tools_as_codeactagents_prompt_does() -> None:
    pytest.importorskip("llama_index.core", reason="the [llamaindex] extra is not installed")
    from llama_index.core.tools import FunctionTool, QueryEngineTool, ToolMetadata

    from exec_sandbox.integrations.llamaindex import code_tools

    async def price(item: str) -> int:
        return len(item)

    executor = FunctionTool.from_defaults(_search, name="execute")  # the agent's own
    found = code_tools(
        [FunctionTool.from_defaults(price, name="lookup"), _search_tool(), executor], "python"
    )
    # The prompt shows `def price(...)`; the tool's own name calls it too.
    assert sorted(found) == ["lookup", "price", "search"]
    assert asyncio.run(found["lookup"]("abc")) == 3
    with pytest.raises(ValueError, match="cannot be called"):
        code_tools([FunctionTool.from_defaults(_search, name="search")], "python")
    other = QueryEngineTool(query_engine=None, metadata=ToolMetadata(name="q", description="d"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a FunctionTool"):
        code_tools([other], "python")


def _search_tool() -> Any:
    from llama_index.core.tools import FunctionTool

    def search(query: str) -> str:
        return query

    return FunctionTool.from_defaults(search)


def test_a_langchain_tools_list_of_dataclasses_reaches_the_code_as_json() -> None:
    import dataclasses
    import json

    from langchain_core.tools import tool

    from exec_sandbox.host_tools import TOOL_OK, HostTools

    @dataclasses.dataclass
    class Hit:
        title: str

    @tool
    def search(query: str) -> list[object]:
        """Search."""
        return [Hit(query)]

    function = host_function(search)
    assert function is not None
    args = json.dumps({"args": ["x"], "kwargs": {}}).encode()
    status, body, _ = asyncio.run(HostTools({"search": function}).call("search", args))
    assert (status, json.loads(body)) == (TOOL_OK, [{"title": "x"}])
