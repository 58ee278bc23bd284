"""LlamaIndex: CodeActAgent with our code_execute_fn, and a ReActAgent with ExecSandboxToolSpec,
both driven by LlamaIndex's own agent workflows with a scripted LLM; code runs in real VMs, its
output must reach the LLM's next prompt, and the agent's tools, called by name from the code,
must run on the host."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")

from llama_index.core.agent.workflow import CodeActAgent, ReActAgent
from llama_index.core.llms import (
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.tools import FunctionTool
from pydantic import Field

from exec_sandbox.integrations.llamaindex import (
    ExecSandboxToolSpec,
    create_code_execute_fn,
)

from .code_mode_tools import (
    EXPECTED_CALLS,
    STEP_ONE,
    STEP_TWO,
    assert_step_outputs,
    recorded_tools,
)
from .conftest import GUEST_PROOF_CODE, GUEST_PROOF_OUTPUT

pytestmark = pytest.mark.vm


class ScriptedLLM(CustomLLM):
    """Replies with the scripted texts in order and records every prompt it was given."""

    replies: list[str] = Field(default_factory=list)
    seen: list[str] = Field(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted", is_chat_model=False)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.seen.append(prompt)
        return CompletionResponse(text=self.replies.pop(0) if self.replies else "done")

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        response = self.complete(prompt)
        yield response


async def test_codeact_agent_runs_code_with_state_across_steps() -> None:
    code_execute_fn = create_code_execute_fn()
    llm = ScriptedLLM(
        replies=[
            f"<execute>\nx = 41\n{GUEST_PROOF_CODE}\n</execute>",
            "<execute>\nprint(x + 1)\n</execute>",
            "<execute>\nprint(undefined_name)\n</execute>",
            "All done.",
        ]
    )
    agent = CodeActAgent(code_execute_fn=code_execute_fn, llm=llm, streaming=False)
    try:
        response = await agent.run(user_msg="compute")
    finally:
        await code_execute_fn.executor.aclose()  # type: ignore[attr-defined]
    assert "All done." in str(response)
    assert GUEST_PROOF_OUTPUT in llm.seen[1]
    assert "42" in llm.seen[2].split(GUEST_PROOF_OUTPUT, 1)[1]  # x survived between steps
    assert "NameError" in llm.seen[3]


async def test_codeact_agent_tools_are_functions_in_the_code_and_run_on_the_host() -> None:
    calls, search, price = recorded_tools()
    # The same tools for the agent (its prompt) and the executor (the VM): a FunctionTool and
    # a plain async function.
    tools: list[Any] = [FunctionTool.from_defaults(search), price]
    code_execute_fn = create_code_execute_fn(tools=tools)
    llm = ScriptedLLM(
        replies=[
            f"<execute>\n{STEP_ONE}\n</execute>",
            f"<execute>\n{STEP_TWO}\n</execute>",
            "The books cost 13 euros.",
        ]
    )
    agent = CodeActAgent(
        code_execute_fn=code_execute_fn, llm=llm, tools=list(tools), streaming=False
    )
    try:
        response = await agent.run(user_msg="What do the books cost?")
    finally:
        await code_execute_fn.executor.aclose()  # type: ignore[attr-defined]
    assert "The books cost 13 euros." in str(response)
    # The names the agent's prompt shows are the names the code called.
    assert "def search(query: str) -> list[str]" in llm.seen[0]
    assert "def price(item: str) -> int" in llm.seen[0]
    assert_step_outputs(llm.seen[1], llm.seen[2].split("hits ['book-a', 'book-bb']", 1)[1])
    assert calls == EXPECTED_CALLS


async def test_react_agent_uses_the_tool_spec() -> None:
    def action(args: dict[str, str]) -> str:
        return f"Thought: I need to run code.\nAction: run_code\nAction Input: {json.dumps(args)}"

    llm = ScriptedLLM(
        replies=[
            action({"code": GUEST_PROOF_CODE}),
            action({"code": "print(1)", "language": "cobol"}),
            action({"code": ""}),
            "Thought: I can answer.\nAnswer: finished",
        ]
    )
    agent = ReActAgent(tools=ExecSandboxToolSpec().to_tool_list(), llm=llm, streaming=False)
    response = await agent.run(user_msg="compute")
    assert "finished" in str(response)
    assert f"Observation: {GUEST_PROOF_OUTPUT}" in llm.seen[1]
    assert "unknown language 'cobol'" in llm.seen[2]
    assert "code is empty" in llm.seen[3]


def test_tool_spec_sync_call() -> None:
    assert ExecSandboxToolSpec().run_code("echo $((40 + 2))", language="raw") == "42"


def test_packages_for_the_tool_spec_and_the_code_execute_fn() -> None:
    spec = ExecSandboxToolSpec(packages=["six==1.16.0"])
    assert spec.run_code("import six; print(six.__version__)") == "1.16.0"
    code_execute_fn = create_code_execute_fn(packages=["six==1.16.0"])
    try:
        out = asyncio.run(
            code_execute_fn("import six; print(six.moves.reduce(lambda a, b: a + b, [1, 2]))")
        )
        assert out == "3"
    finally:
        code_execute_fn.executor.close()  # type: ignore[attr-defined]
