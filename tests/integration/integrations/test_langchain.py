"""LangChain: the tools driven by langchain's own agent loop (create_agent) with a scripted chat
model; the code runs in real VMs and its output must reach the model's next turn."""

from __future__ import annotations

import asyncio
import base64

import pytest

pytest.importorskip("langchain", reason="the langchain extra is not installed")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage

from exec_sandbox.integrations.langchain import (
    ExecSandboxSessionTool,
    ExecSandboxTool,
)
from tests.helpers import MATPLOTLIB, PACKAGE_TIMEOUT_SECONDS

from .conftest import GUEST_PROOF_CODE, GUEST_PROOF_OUTPUT, PNG_1X1, SHOW_PNG_CODE
from .fake_langchain_model import ScriptedChatModel

pytestmark = pytest.mark.vm


def _call(name: str, args: dict[str, str], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def _tool_messages(model: ScriptedChatModel, turn: int) -> list[ToolMessage]:
    return [m for m in model.seen[turn] if isinstance(m, ToolMessage)]


def test_agent_loop_sees_vm_output_and_artifact() -> None:
    model = ScriptedChatModel(
        responses=[
            _call("exec_sandbox", {"code": GUEST_PROOF_CODE}, "c1"),
            _call(
                "exec_sandbox",
                {"code": "import sys; print('to stderr', file=sys.stderr); sys.exit(3)"},
                "c2",
            ),
            AIMessage(content="done"),
        ]
    )
    agent = create_agent(model, tools=[ExecSandboxTool()])
    final = agent.invoke({"messages": [("user", "run it")]})

    assert final["messages"][-1].content == "done"
    first = _tool_messages(model, 1)[-1]
    assert first.content == GUEST_PROOF_OUTPUT
    assert first.artifact["exit_code"] == 0
    assert first.artifact["stdout"] == GUEST_PROOF_OUTPUT + "\n"
    assert first.artifact["timing"]["total_ms"] > 0
    # A non-zero exit is ordinary output, not a tool error.
    second = _tool_messages(model, 2)[-1]
    assert second.status == "success"
    assert second.artifact["exit_code"] == 3
    assert "to stderr" in second.content and "exit code: 3" in second.content


async def test_async_agent_loop_reports_bad_arguments_to_the_model() -> None:
    model = ScriptedChatModel(
        responses=[
            _call("exec_sandbox", {"code": "print(1)", "language": "cobol"}, "c1"),
            _call("exec_sandbox", {"code": "   "}, "c2"),
            _call("exec_sandbox", {"code": "console.log(40 + 2)", "language": "javascript"}, "c3"),
            AIMessage(content="done"),
        ]
    )
    agent = create_agent(model, tools=[ExecSandboxTool()])
    await agent.ainvoke({"messages": [("user", "go")]})

    # The args schema's enum refuses it; langgraph's ToolNode shows the model the allowed values.
    bad_language = _tool_messages(model, 1)[-1]
    assert bad_language.status == "error"
    assert "'python', 'javascript', 'typescript', 'ts' or 'raw'" in bad_language.content
    empty = _tool_messages(model, 2)[-1]
    assert empty.status == "error" and "code is empty" in empty.content
    assert _tool_messages(model, 3)[-1].content == "42"


async def test_sync_run_works_inside_a_running_loop() -> None:
    # A framework calling the sync API from its event loop must not deadlock.
    tool = ExecSandboxTool()
    message = tool.invoke(
        {"type": "tool_call", "id": "x", "name": tool.name, "args": {"code": GUEST_PROOF_CODE}}
    )
    assert message.content == GUEST_PROOF_OUTPUT
    assert asyncio.get_running_loop().is_running()


def test_session_tool_keeps_state_per_thread() -> None:
    tool = ExecSandboxSessionTool()
    try:

        def run(thread: str, code: str) -> ToolMessage:
            model = ScriptedChatModel(
                responses=[
                    _call(tool.name, {"code": code}, "c1"),
                    AIMessage(content="ok"),
                ]
            )
            agent = create_agent(model, tools=[tool])
            agent.invoke(
                {"messages": [("user", "go")]}, config={"configurable": {"thread_id": thread}}
            )
            return _tool_messages(model, 1)[-1]

        run("alice", "x = 41")
        assert run("alice", "print(x + 1)").content == "42"
        other = run("bob", "print(x + 1)")
        assert "NameError" in other.content and other.artifact["exit_code"] == 1
        assert sorted(tool.thread_ids) == ["alice", "bob"]
    finally:
        tool.close()
    assert tool.thread_ids == []


def test_the_model_can_ask_for_packages() -> None:
    model = ScriptedChatModel(
        responses=[
            _call(
                "exec_sandbox",
                {"code": "import six; print(six.__version__)", "packages": ["six==1.16.0"]},
                "p1",
            ),  # type: ignore[dict-item]
            _call("exec_sandbox", {"code": "print(1)", "packages": ["six; rm -rf /"]}, "p2"),  # type: ignore[dict-item]
            AIMessage(content="done"),
        ]
    )
    agent = create_agent(model, tools=[ExecSandboxTool()])
    agent.invoke({"messages": [("user", "run it")]})
    assert _tool_messages(model, 1)[-1].content == "1.16.0"
    refused = _tool_messages(model, 2)[-1]
    assert "PackageNotAllowedError" in refused.content


async def test_figures_come_back_as_image_blocks_and_values_as_text() -> None:
    tool = ExecSandboxTool(timeout_seconds=PACKAGE_TIMEOUT_SECONDS)
    message = await tool.ainvoke(
        {"type": "tool_call", "name": "exec_sandbox", "args": {"code": SHOW_PNG_CODE}, "id": "c1"}
    )
    assert isinstance(message, ToolMessage)
    text, image = message.content
    assert isinstance(text, dict) and isinstance(image, dict)
    assert text["type"] == "text" and "shown" in text["text"] and "Chart()" in text["text"]
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert base64.b64decode(image["base64"]) == PNG_1X1
    kinds = [o["mime_type"] for o in message.artifact["outputs"]]
    assert kinds == ["image/png", "text/plain"]

    # A matplotlib chart shown with plt.show() and never saved: an image block too.
    chart = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('drawn')"
    message = await tool.ainvoke(
        {
            "type": "tool_call",
            "name": "exec_sandbox",
            "args": {"code": chart, "packages": [MATPLOTLIB]},
            "id": "c2",
        }
    )
    text, image = message.content
    assert isinstance(text, dict) and isinstance(image, dict), message.content
    assert text["text"].startswith("drawn\n[output: image/png, ")
    assert base64.b64decode(image["base64"]).startswith(b"\x89PNG\r\n\x1a\n")

    # A session cell's last expression is its value, in the text the model reads.
    session_tool = ExecSandboxSessionTool()
    try:
        config = {"configurable": {"thread_id": "values"}}
        await session_tool.ainvoke({"code": "x = 20"}, config=config)
        reply = await session_tool.ainvoke({"code": "x * 2 + 2"}, config=config)
        assert reply == "42"
    finally:
        await session_tool.aclose()
