"""langgraph-codeact: create_codeact's own graph with a scripted model; its code blocks run in
real VMs through our eval functions, and the output must reach the model's next turn."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph_codeact", reason="the codeact extra is not installed")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_codeact import create_codeact

from exec_sandbox.integrations.codeact import (
    ExecSandboxSessionEval,
    create_exec_sandbox_async_eval,
    create_exec_sandbox_eval,
)

from .conftest import GUEST_PROOF_CODE, GUEST_PROOF_OUTPUT
from .fake_langchain_model import ScriptedChatModel

pytestmark = pytest.mark.vm


def _code(source: str) -> AIMessage:
    return AIMessage(content=f"Let me run this.\n```python\n{source}\n```")


def _last_user_text(model: ScriptedChatModel, turn: int) -> str:
    humans = [m for m in model.seen[turn] if isinstance(m, HumanMessage)]
    return str(humans[-1].content)


def test_sync_eval_output_reaches_the_model() -> None:
    model = ScriptedChatModel(
        responses=[
            _code(GUEST_PROOF_CODE),
            _code("raise ValueError('boom')"),
            AIMessage(content="done"),
        ]
    )
    agent = create_codeact(model, [], create_exec_sandbox_eval(timeout_seconds=30)).compile()
    final = agent.invoke({"messages": [("user", "go")]})

    assert final["messages"][-1].content == "done"
    assert _last_user_text(model, 1) == GUEST_PROOF_OUTPUT
    failed = _last_user_text(model, 2)
    assert "ValueError: boom" in failed and "exit code: 1" in failed


async def test_async_eval_output_reaches_the_model() -> None:
    model = ScriptedChatModel(responses=[_code(GUEST_PROOF_CODE), AIMessage(content="done")])
    eval_fn = create_exec_sandbox_async_eval()
    agent = create_codeact(model, [], eval_fn).compile()
    await agent.ainvoke({"messages": [("user", "go")]})
    assert _last_user_text(model, 1) == GUEST_PROOF_OUTPUT


def test_fresh_vm_per_block_without_sessions() -> None:
    model = ScriptedChatModel(
        responses=[
            _code("x = 41"),
            _code("print(x + 1)"),
            AIMessage(content="done"),
        ]
    )
    agent = create_codeact(model, [], create_exec_sandbox_eval()).compile()
    agent.invoke({"messages": [("user", "go")]})
    assert "NameError" in _last_user_text(model, 2)


@pytest.mark.parametrize("use_async", [False, True])
async def test_session_eval_keeps_variables_across_turns_of_a_thread(use_async: bool) -> None:
    evaluator = ExecSandboxSessionEval()
    eval_fn = evaluator.aeval if use_async else evaluator.eval
    model = ScriptedChatModel(
        responses=[
            _code("x = 41"),
            AIMessage(content="stored"),
            _code("print(x + 1)"),
            AIMessage(content="printed"),
            _code("print(x + 1)"),
            AIMessage(content="other thread"),
        ]
    )
    agent = create_codeact(model, [], eval_fn).compile(checkpointer=InMemorySaver())
    try:
        one = {"configurable": {"thread_id": "one"}}
        two = {"configurable": {"thread_id": "two"}}
        await agent.ainvoke({"messages": [("user", "store x")]}, config=one)
        await agent.ainvoke({"messages": [("user", "print x + 1")]}, config=one)
        assert _last_user_text(model, 3) == "42"
        await agent.ainvoke({"messages": [("user", "print x + 1")]}, config=two)
        assert "NameError" in _last_user_text(model, 5)
        assert sorted(evaluator.thread_ids) == ["one", "two"]
    finally:
        await evaluator.aclose()
