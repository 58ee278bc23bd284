"""State honesty: when the session behind a conversation key ended on its own (here by the
session's own idle timeout, run on its loop) the next result the model reads says so, and a call
without a key runs in a VM of its own instead of one shared by every caller without a key."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from exec_sandbox.integrations._bridge import background

pytestmark = pytest.mark.vm

ENDED = "[sandbox note: the previous session ended (idle for"


def _idle_out(session: Any) -> None:
    """What the scheduler's idle timeout does to a session, now."""
    background().loop.call_soon_threadsafe(session._on_idle)
    deadline = time.monotonic() + 10
    while not session.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session.closed


def _tool_call(tool: Any, code: str, config: dict[str, Any] | None = None) -> Any:
    call = {"type": "tool_call", "id": uuid.uuid4().hex, "name": tool.name, "args": {"code": code}}
    return tool.invoke(call, config)


def test_langchain_session_tool_says_when_its_thread_lost_its_session() -> None:
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
    from exec_sandbox.integrations.langchain import ExecSandboxSessionTool

    tool = ExecSandboxSessionTool()
    config = {"configurable": {"thread_id": "t"}}
    try:
        assert _tool_call(tool, "x = 41", config).content == "(no output)"
        _idle_out(tool._pool._sessions["t"])
        after = _tool_call(tool, "print(x + 1)", config)
        assert after.content.startswith(ENDED), after.content
        assert "variables and files from earlier calls are gone" in after.content
        assert "NameError" in after.content
        assert after.artifact["sandbox_note"].startswith(ENDED)
        # Said once: the new session keeps state again.
        assert _tool_call(tool, "x = 1", config).content == "(no output)"
        assert _tool_call(tool, "print(x)", config).content == "1"
    finally:
        tool.close()


def test_langchain_session_tool_without_a_thread_id_shares_no_vm() -> None:
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
    from exec_sandbox.integrations.langchain import ExecSandboxSessionTool

    tool = ExecSandboxSessionTool()
    try:
        first = _tool_call(tool, "x = 41")
        assert first.content.startswith("[sandbox note: no thread_id in the run's config")
        second = _tool_call(tool, "print(x)")
        assert "NameError" in second.content  # not the first caller's VM
        assert tool.thread_ids == []  # and none kept
    finally:
        tool.close()


def test_codeact_session_eval_notes_and_no_shared_default_vm() -> None:
    pytest.importorskip("langgraph", reason="the codeact extra is not installed")
    from exec_sandbox.integrations.codeact import ExecSandboxSessionEval

    evaluator = ExecSandboxSessionEval()
    try:
        # Called outside a LangGraph run: no thread id, a VM of its own each time.
        alone, _ = evaluator.eval("x = 41", {})
        assert alone.startswith("[sandbox note: no LangGraph thread_id was given")
        again, _ = evaluator.eval("print(x)", {})
        assert "NameError" in again
        assert evaluator.thread_ids == []
    finally:
        evaluator.close()


def test_deepagents_execute_says_when_the_shell_was_lost_and_file_ops_stay_parseable() -> None:
    pytest.importorskip("deepagents", reason="the deepagents extra is not installed")
    from exec_sandbox.integrations.deepagents import ExecSandboxBackend

    backend = ExecSandboxBackend()
    try:
        assert backend.execute("export MARK=yes").exit_code == 0
        _idle_out(backend._holder[0])
        # BaseSandbox's own operations parse execute()'s output: the note waits for the model's.
        assert backend.write("/tmp/n/a.txt", "hello\n").error is None
        read = backend.read("/tmp/n/a.txt")
        assert read.error is None and read.file_data is not None
        result = backend.execute("echo mark=$MARK")
        assert result.output.startswith(ENDED), result.output
        assert result.output.rstrip().endswith("mark=")
        assert backend.execute("echo again").output == "again\n"
        timed_out = backend.execute("sleep 30", timeout=1)
        assert timed_out.exit_code == 124 and "the shell was reset" in timed_out.output
    finally:
        backend.close()


def test_adk_stateful_executor_says_when_its_session_was_lost() -> None:
    pytest.importorskip("google.adk", reason="the adk extra is not installed")
    from google.adk.code_executors.code_execution_utils import CodeExecutionInput

    from exec_sandbox.integrations.adk import ExecSandboxCodeExecutor

    executor = ExecSandboxCodeExecutor(stateful=True)
    key = f"exec-{uuid.uuid4().hex}"
    try:
        executor.execute_code(None, CodeExecutionInput(code="x = 41", execution_id=key))  # type: ignore[arg-type]
        _idle_out(executor._pool._sessions[key])
        after = executor.execute_code(
            None,  # type: ignore[arg-type]
            CodeExecutionInput(code="print('x' in globals())", execution_id=key),
        )
        assert after.stdout.startswith(ENDED) and after.stdout.endswith("False\n")
    finally:
        executor.close()


async def test_llamaindex_code_execute_fn_says_when_its_session_was_lost() -> None:
    pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")
    from exec_sandbox.integrations.llamaindex import create_code_execute_fn

    code_execute_fn = create_code_execute_fn()
    executor = code_execute_fn.executor  # type: ignore[attr-defined]
    try:
        assert await code_execute_fn("x = 41") == "(no output)"
        session = executor._pool._sessions["codeact"]
        background().loop.call_soon_threadsafe(session._on_idle)
        while not session.closed:
            await __import__("asyncio").sleep(0.05)
        after = await code_execute_fn("print('x' in globals())")
        assert after.startswith(ENDED) and after.endswith("False")
    finally:
        await executor.aclose()
