"""langgraph-codeact: create_codeact's own graph with a scripted model; its code blocks run in
real VMs through our eval functions, the output must reach the model's next turn, and the
agent's tools, called by name from the code, must run on the host."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph_codeact", reason="the codeact extra is not installed")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_codeact import create_codeact, create_default_prompt

from exec_sandbox.integrations.codeact import (
    ExecSandboxSessionEval,
    create_exec_sandbox_async_eval,
    create_exec_sandbox_eval,
)

from .code_mode_tools import (
    EXPECTED_CALLS,
    STEP_ONE,
    STEP_TWO,
    assert_step_outputs,
    recorded_tools,
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


async def test_the_agents_tools_are_functions_in_the_code_and_run_on_the_host() -> None:
    calls, search, price = recorded_tools()
    # create_codeact puts each tool's sync function in _locals (search arrives that way); a
    # tool with only a coroutine arrives as None, and its default prompt cannot describe one,
    # so price is given to the eval function and described in a prompt of our own.
    evaluator = ExecSandboxSessionEval(tools=[price])
    prompt = create_default_prompt([search]) + "\n\nAlso: def price(item: str) -> int"
    model = ScriptedChatModel(
        responses=[_code(STEP_ONE), _code(STEP_TWO), AIMessage(content="The total is 13 euros.")]
    )
    agent = create_codeact(model, [search, price], evaluator.aeval, prompt=prompt).compile(
        checkpointer=InMemorySaver()
    )
    try:
        final = await agent.ainvoke(
            {"messages": [("user", "What do the books cost?")]},
            config={"configurable": {"thread_id": "shop"}},
        )
    finally:
        await evaluator.aclose()
    assert final["messages"][-1].content == "The total is 13 euros."
    system = model.seen[0][0]
    assert isinstance(system, SystemMessage) and "def search(query: str)" in str(system.content)
    assert_step_outputs(_last_user_text(model, 1), _last_user_text(model, 2))
    assert calls == EXPECTED_CALLS


def test_tools_without_a_session() -> None:
    calls, search, price = recorded_tools()
    # The stateless eval: one run() per block, the tools bound in front of the code.
    eval_fn = create_exec_sandbox_eval(tools=[price])
    text, new_vars = eval_fn('print(search("pen"), price("pen-a"))', {"search": search})
    assert (text, new_vars) == ("['pen-a', 'pen-bb'] 5", {})
    # The session eval outside a LangGraph run: a session of its own, and a note saying so.
    evaluator = ExecSandboxSessionEval()
    try:
        text, _ = evaluator.eval('print(search("cup"))', {"search": search, "price": None})
    finally:
        evaluator.close()
    assert "no LangGraph thread_id was given" in text and "['cup-a', 'cup-bb']" in text
    assert calls == [("search", "pen"), ("price", "pen-a"), ("search", "cup")]
