"""Deep Agents: create_deep_agent with ExecSandboxBackend and a scripted model; its file and
shell tools act in a real VM and the results reach the model's next turn. Plus the backend's
own contract points the standard suite does not pin down (timeout 124, truncation)."""

from __future__ import annotations

import pytest

pytest.importorskip("deepagents", reason="the deepagents extra is not installed")

from deepagents import create_deep_agent  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402

from exec_sandbox.integrations.deepagents import ExecSandboxBackend  # noqa: E402

from .conftest import GUEST_PROOF_OUTPUT  # noqa: E402
from .fake_langchain_model import ScriptedChatModel  # noqa: E402

pytestmark = pytest.mark.vm


def _call(name: str, args: dict[str, object], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def _last_tool_message(model: ScriptedChatModel, turn: int) -> ToolMessage:
    return [m for m in model.seen[turn] if isinstance(m, ToolMessage)][-1]


async def test_deep_agent_writes_and_executes_in_the_vm() -> None:
    backend = ExecSandboxBackend()
    model = ScriptedChatModel(responses=[
        _call("write_file", {"file_path": "/tmp/work/calc.py",
                             "content": "import os\nprint(os.uname().nodename, os.getuid(), 6 * 7)\n"}, "c1"),
        _call("execute", {"command": "python3 /tmp/work/calc.py"}, "c2"),
        _call("execute", {"command": "sleep 30", "timeout": 2}, "c3"),
        _call("execute", {"command": "echo partial; exit 5"}, "c4"),
        AIMessage(content="done"),
    ])  # fmt: skip
    agent = create_deep_agent(model=model, backend=backend)
    try:
        await agent.ainvoke({"messages": [("user", "compute")]})
    finally:
        await backend.aclose()
    assert "Updated file /tmp/work/calc.py" in str(_last_tool_message(model, 1).content)
    assert GUEST_PROOF_OUTPUT in str(_last_tool_message(model, 2).content)
    assert "124" in str(_last_tool_message(model, 3).content)
    last = str(_last_tool_message(model, 4).content)
    assert "partial" in last and "5" in last


def test_timeout_exit_124_and_truncation() -> None:
    backend = ExecSandboxBackend(max_output_bytes=1000)
    try:
        timed_out = backend.execute("echo started; sleep 30", timeout=2)
        assert timed_out.exit_code == 124
        assert "started" in timed_out.output and "timed out" in timed_out.output
        big = backend.execute("head -c 5000 /dev/zero | tr '\\0' x")
        assert big.truncated is True and big.exit_code == 0
        assert big.output == "x" * 1000
        small = backend.execute("echo ok >&2; echo fine")
        assert small.truncated is False and "ok" in small.output and "fine" in small.output
        empty = backend.execute("   ")
        assert empty.exit_code != 0 and "empty" in empty.output
    finally:
        backend.close()


def test_files_never_raise_and_keep_input_order() -> None:
    backend = ExecSandboxBackend()
    try:
        uploads = backend.upload_files([
            ("/tmp/a/b/c.bin", bytes(range(256))), ("relative.txt", b"x"), ("/proc/nope/x", b"y"),
        ])  # fmt: skip
        assert [u.path for u in uploads] == ["/tmp/a/b/c.bin", "relative.txt", "/proc/nope/x"]
        assert uploads[0].error is None
        assert uploads[1].error == "invalid_path"
        assert uploads[2].error is not None
        downloads = backend.download_files(["/tmp/missing", "/tmp/a/b/c.bin", "/tmp/a"])
        assert [(d.path, d.error) for d in downloads] == [
            ("/tmp/missing", "file_not_found"), ("/tmp/a/b/c.bin", None), ("/tmp/a", "is_directory"),
        ]  # fmt: skip
        assert downloads[1].content == bytes(range(256))
        assert backend.id.startswith("exec-sandbox-")
    finally:
        backend.close()
