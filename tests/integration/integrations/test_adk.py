"""Google ADK: an LlmAgent with ExecSandboxCodeExecutor driven by ADK's own Runner and a scripted
BaseLlm; the model's code blocks run in real VMs and the result reaches the model's next turn."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the adk extra is not installed")

from google.adk.agents import LlmAgent
from google.adk.code_executors.code_execution_utils import CodeExecutionInput, File
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types
from pydantic import Field

from exec_sandbox.integrations.adk import MAX_OUTPUT_FILES, ExecSandboxCodeExecutor

from .conftest import GUEST_PROOF_CODE, GUEST_PROOF_OUTPUT, PNG_1X1, SHOW_PNG_CODE

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.vm


class ScriptedLlm(BaseLlm):
    """Answers with the scripted texts in order and records every request's text."""

    model: str = "scripted"
    replies: list[str] = Field(default_factory=list)
    seen: list[str] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(
            "\n".join(
                part.text or "" for content in llm_request.contents for part in content.parts or []
            )
        )
        text = self.replies.pop(0) if self.replies else "done"
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def _code(source: str) -> str:
    return f"```python\n{source}\n```"


async def _ask(runner: InMemoryRunner, session_id: str, text: str) -> list[Any]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [
        event
        async for event in runner.run_async(user_id="u", session_id=session_id, new_message=message)
    ]


async def _runner(
    llm: ScriptedLlm, executor: ExecSandboxCodeExecutor
) -> tuple[InMemoryRunner, str]:
    agent = LlmAgent(name="coder", model=llm, code_executor=executor)
    runner = InMemoryRunner(agent=agent, app_name="test")
    session = await runner.session_service.create_session(app_name="test", user_id="u")
    return runner, session.id


async def test_agent_code_output_reaches_the_model() -> None:
    llm = ScriptedLlm(replies=[_code(GUEST_PROOF_CODE), "done"])
    runner, session_id = await _runner(llm, ExecSandboxCodeExecutor())
    await _ask(runner, session_id, "compute")
    assert len(llm.seen) == 2
    assert GUEST_PROOF_OUTPUT in llm.seen[1]


async def test_stateful_executor_keeps_variables_per_execution_id() -> None:
    executor = ExecSandboxCodeExecutor(stateful=True)
    llm = ScriptedLlm(replies=[_code("x = 41"), "stored", _code("print(x + 1)"), "printed"])
    runner, session_id = await _runner(llm, executor)
    try:
        await _ask(runner, session_id, "store")
        await _ask(runner, session_id, "print")
        assert "42" in llm.seen[3]
        assert "NameError" not in llm.seen[3]
    finally:
        executor.close()


async def test_sync_execute_code_from_inside_a_running_loop() -> None:
    # ADK may call execute_code synchronously on its loop: it must not deadlock, and other
    # threads' work keeps going meanwhile (the VM work runs on the background loop thread).
    executor = ExecSandboxCodeExecutor()
    results: dict[str, Any] = {}

    def in_thread() -> None:
        results["thread"] = executor.execute_code(None, CodeExecutionInput(code="print('t')"))  # type: ignore[arg-type]

    worker = threading.Thread(target=in_thread)
    worker.start()
    result = executor.execute_code(None, CodeExecutionInput(code=GUEST_PROOF_CODE))  # type: ignore[arg-type]
    worker.join(timeout=120)
    assert asyncio.get_running_loop().is_running()
    assert result.stdout.strip() == GUEST_PROOF_OUTPUT and result.stderr == ""
    assert results["thread"].stdout == "t\n"


def test_input_files_output_files_and_stderr_only_on_failure() -> None:
    executor = ExecSandboxCodeExecutor()
    blob = bytes(range(256))
    ok = executor.execute_code(
        None,
        CodeExecutionInput(  # type: ignore[arg-type]
            code=(
                "import sys\n"
                "data = open('data.bin', 'rb').read()\n"
                "open('out.bin', 'wb').write(data[::-1])\n"
                "print(len(data)); print('warning', file=sys.stderr)"
            ),
            input_files=[File(name="data.bin", content=blob, mime_type="application/octet-stream")],
        ),
    )
    assert ok.stdout == "256\n"
    assert ok.stderr == ""  # a warning on stderr is not a failure
    assert [(f.name, f.content) for f in ok.output_files] == [("out.bin", blob[::-1])]

    failed = executor.execute_code(None, CodeExecutionInput(code="1 / 0"))  # type: ignore[arg-type]
    assert "ZeroDivisionError" in failed.stderr and failed.exit_code == 1

    empty = executor.execute_code(None, CodeExecutionInput(code="  "))  # type: ignore[arg-type]
    assert "code is empty" in empty.stderr


async def test_new_files_in_subdirectories_become_artifacts_the_model_sees() -> None:
    code = (
        "import os\n"
        "os.makedirs('results/deep', exist_ok=True); os.makedirs('.cache/tool', exist_ok=True)\n"
        "open('results/summary.txt', 'w').write(os.uname().nodename)\n"
        "open('results/deep/data.bin', 'wb').write(bytes([os.getuid() % 256]) * 3)\n"
        "open('.cache/tool/state', 'w').write('noise')\n"
        "print('wrote')"
    )
    llm = ScriptedLlm(replies=[_code(code), "done"])
    runner, session_id = await _runner(llm, ExecSandboxCodeExecutor())
    await _ask(runner, session_id, "write results")
    assert "wrote" in llm.seen[1]
    saved = llm.seen[1].split("Saved artifacts:")[1]
    assert "`results/deep/data.bin`" in saved and "`results/summary.txt`" in saved
    assert ".cache" not in saved  # dot-directories hold tool state, not results
    service = runner.artifact_service
    assert service is not None
    summary = await service.load_artifact(
        app_name="test", user_id="u", session_id=session_id, filename="results/summary.txt"
    )
    data = await service.load_artifact(
        app_name="test", user_id="u", session_id=session_id, filename="results/deep/data.bin"
    )
    assert summary is not None and summary.inline_data is not None
    assert summary.inline_data.data == b"sandbox"  # the guest's hostname: written in the VM
    assert data is not None and data.inline_data is not None
    assert data.inline_data.data == bytes([1000 % 256]) * 3


def test_output_files_are_capped_with_a_note() -> None:
    executor = ExecSandboxCodeExecutor()
    count = MAX_OUTPUT_FILES + 3
    result = executor.execute_code(
        None,
        CodeExecutionInput(  # type: ignore[arg-type]
            code=(
                "import os\nos.makedirs('many/sub')\n"
                f"for i in range({count}): open(f'many/sub/f{{i:03}}.txt', 'w').write(str(i))\n"
                "print('ok')"
            ),
        ),
    )
    assert result.stdout.startswith("ok\n")
    assert len(result.output_files) == MAX_OUTPUT_FILES
    first = result.output_files[0]
    assert first.name == "many/sub/f000.txt" and first.content == b"0"
    assert "3 new or changed file(s) not returned" in result.stdout
    assert f"many/sub/f{count - 1:03}.txt" in result.stdout


def test_packages_are_installed_for_the_executor() -> None:
    executor = ExecSandboxCodeExecutor(packages=["six==1.16.0"])
    result = executor.execute_code(
        None,
        CodeExecutionInput(  # type: ignore[arg-type]
            code="import six; print(six.__version__)"
        ),
    )
    assert (result.stdout, result.stderr) == ("1.16.0\n", "")


def test_persisted_sessions_come_back_for_their_execution_id() -> None:
    """close() pauses the id's session to disk; a new executor (as after a restart) resumes it."""
    key = f"thread-{uuid.uuid4().hex}"
    first = ExecSandboxCodeExecutor(stateful=True, persist_sessions=True)
    run = first.execute_code(
        None,
        CodeExecutionInput(  # type: ignore[arg-type]
            code="kept = 'across restarts'\nopen('note.txt', 'w').write('file too')",
            execution_id=key,
        ),
    )
    assert run.stderr == ""
    first.close()
    second = ExecSandboxCodeExecutor(stateful=True, persist_sessions=True)
    try:
        back = second.execute_code(
            None,
            CodeExecutionInput(  # type: ignore[arg-type]
                code="print(kept, open('note.txt').read())", execution_id=key
            ),
        )
        assert back.stdout == "across restarts file too\n"
        other = second.execute_code(
            None,
            CodeExecutionInput(  # type: ignore[arg-type]
                code="print('kept' in globals())", execution_id=key + "-other"
            ),
        )
        assert other.stdout == "False\n"
    finally:
        saved = second._pool._saved
        assert saved is not None
        second._pool._saved = None  # this test's sessions are not kept
        second.close()
        second._pool.runner.run(lambda s: _forget(saved, s, key))


async def _forget(saved: Any, scheduler: Any, key: str) -> None:
    await saved.forget(scheduler, key)


def test_input_files_are_written_only_when_new_or_changed_and_changed_files_come_back() -> None:
    executor = ExecSandboxCodeExecutor(stateful=True)
    key = f"exec-{uuid.uuid4().hex}"
    writes: list[str] = []

    def run(code: str, *inputs: tuple[str, bytes]) -> Any:
        files = [File(name=n, content=c, mime_type="text/plain") for n, c in inputs]
        result = executor.execute_code(
            None,  # type: ignore[arg-type]
            CodeExecutionInput(code=code, input_files=files, execution_id=key),
        )
        assert result.stderr == "", result.stderr
        return result

    try:
        run("open('notes.txt', 'w').write('v1')", ("data.csv", b"a,b\n"))
        session = executor._pool._sessions[key]
        write_file = session.write_file

        async def counted(path: str, *args: Any, **kwargs: Any) -> Any:
            writes.append(path)
            return await write_file(path, *args, **kwargs)

        session.write_file = counted  # type: ignore[method-assign]
        # ADK passes every input file on every call: an unchanged one is not sent again.
        same = run("print(open('data.csv').read().strip())", ("data.csv", b"a,b\n"))
        assert (same.stdout, same.output_files, writes) == ("a,b\n", [], [])
        # A file the code changes comes back, as a new one does.
        changed = run("open('notes.txt', 'a').write('+v2')", ("data.csv", b"a,b\n"))
        assert [(f.name, f.content) for f in changed.output_files] == [("notes.txt", b"v1+v2")]
        assert writes == []
        # New content for an input file is written; so is one the code changed in the VM.
        run("print(open('data.csv').read())", ("data.csv", b"c,d\n"))
        assert writes == ["data.csv"]
        edited = run("open('data.csv', 'w').write('edited')", ("data.csv", b"c,d\n"))
        assert [(f.name, f.content) for f in edited.output_files] == [("data.csv", b"edited")]
        back = run("print(open('data.csv').read().strip())", ("data.csv", b"c,d\n"))
        assert back.stdout == "c,d\n" and writes == ["data.csv", "data.csv"]
    finally:
        executor.close()


async def test_async_with_closes_the_executors_vms_without_blocking_the_loop() -> None:
    key = f"exec-{uuid.uuid4().hex}"
    async with ExecSandboxCodeExecutor(stateful=True) as executor:
        ran = await executor.execute_code_async(
            None,  # type: ignore[arg-type]
            CodeExecutionInput(code="x = 1; print(x)", execution_id=key),
        )
        assert ran.stdout == "1\n"
        session = executor._pool._sessions[key]
    assert session.closed  # the no_vm_leak fixture checks that no VM is left
    other = ExecSandboxCodeExecutor(stateful=True)
    await other.execute_code_async(None, CodeExecutionInput(code="y = 2", execution_id=key))  # type: ignore[arg-type]
    await other.aclose()
    assert other._pool.keys() == []


def test_figures_are_output_files_and_values_reach_stdout() -> None:
    executor = ExecSandboxCodeExecutor(stateful=True)
    try:
        shown = executor.execute_code(
            None, CodeExecutionInput(code=SHOW_PNG_CODE, execution_id="fig")
        )  # type: ignore[arg-type]
        assert [(f.mime_type, f.content) for f in shown.output_files] == [("image/png", PNG_1X1)]
        assert shown.output_files[0].name.endswith(".png")
        assert shown.stdout == "shown\nChart()\n"
        value = executor.execute_code(None, CodeExecutionInput(code="6 * 7", execution_id="fig"))  # type: ignore[arg-type]
        assert value.stdout == "42\n" and value.output_files == []
    finally:
        executor.close()


def test_a_persisted_executor_left_open_at_exit_is_paused_for_the_next_process() -> None:
    key = f"thread-{uuid.uuid4().hex}"
    script = textwrap.dedent(f"""
        from google.adk.code_executors.code_execution_utils import CodeExecutionInput
        from exec_sandbox.integrations.adk import ExecSandboxCodeExecutor
        executor = ExecSandboxCodeExecutor(stateful=True, persist_sessions=True)
        run = executor.execute_code(
            None, CodeExecutionInput(code="kept = 'at exit'", execution_id={key!r})
        )
        assert run.stderr == "", run.stderr
        KEEP = executor  # never closed, alive at exit
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    second = ExecSandboxCodeExecutor(stateful=True, persist_sessions=True)
    try:
        back = second.execute_code(
            None,
            CodeExecutionInput(code="print(kept)", execution_id=key),  # type: ignore[arg-type]
        )
        assert back.stdout == "at exit\n", back.stderr
    finally:
        saved = second._pool._saved
        assert saved is not None
        second._pool._saved = None  # this test's sessions are not kept
        second.close()
        second._pool.runner.run(lambda s: _forget(saved, s, key))
