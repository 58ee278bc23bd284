"""Integrations given a RemoteScheduler work unchanged: LangChain's session tool, driven by
langchain's own agent loop with a scripted model, keeps one session per thread on a real
`sbx serve`; the Deep Agents backend's commands, file transfers and per-file errors (which
rest on the library's exceptions coming back as the same classes) behave as in-process."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain", reason="the langchain extra is not installed")
pytest.importorskip("httpx", reason="the remote extra is not installed")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage

from exec_sandbox.integrations.langchain import ExecSandboxSessionTool
from exec_sandbox.remote import RemoteScheduler
from tests.integration.integrations.conftest import GUEST_PROOF_CODE, GUEST_PROOF_OUTPUT
from tests.integration.integrations.fake_langchain_model import ScriptedChatModel

from .support import Server

pytestmark = pytest.mark.vm


async def test_langchain_session_tool_over_the_server_keeps_state_per_thread(
    server: Server,
) -> None:
    async with RemoteScheduler(server.socket) as remote:
        tool = ExecSandboxSessionTool(scheduler=remote)

        async def turn(thread: str, code: str) -> ToolMessage:
            model = ScriptedChatModel(
                responses=[
                    AIMessage(
                        content="",
                        tool_calls=[{"name": tool.name, "args": {"code": code}, "id": "c1"}],
                    ),
                    AIMessage(content="ok"),
                ]
            )
            agent = create_agent(model, tools=[tool])
            await agent.ainvoke(
                {"messages": [("user", "go")]}, config={"configurable": {"thread_id": thread}}
            )
            message = model.seen[1][-1]
            assert isinstance(message, ToolMessage)
            return message

        try:
            assert (await turn("alice", GUEST_PROOF_CODE)).content == GUEST_PROOF_OUTPUT
            await turn("alice", "x = 41")
            assert (await turn("alice", "print(x + 1)")).content == "42"
            other = await turn("bob", "print(x + 1)")
            assert "NameError" in str(other.content) and other.artifact["exit_code"] == 1
            # The threads' sessions live on the server.
            live = [s for s in await remote.sessions() if not s["closed"]]
            assert len(live) == 2
        finally:
            await tool.aclose()
        assert [s for s in await remote.sessions() if not s["closed"]] == []


async def test_deepagents_backend_over_the_server_keeps_its_file_contract(server: Server) -> None:
    pytest.importorskip("deepagents", reason="the deepagents extra is not installed")
    from exec_sandbox.integrations.deepagents import ExecSandboxBackend

    async with RemoteScheduler(server.socket) as remote:
        backend = ExecSandboxBackend(remote)
        try:
            ran = await backend.aexecute("uname -n; id -u")
            assert (ran.exit_code, ran.output) == (0, "sandbox\n1000\n")
            uploads = await backend.aupload_files(
                [("/tmp/a/b.bin", bytes(range(256))), ("relative.txt", b"x")]
            )
            assert [u.error for u in uploads] == [None, "invalid_path"]
            downloads = await backend.adownload_files(["/tmp/missing", "/tmp/a/b.bin", "/tmp/a"])
            assert [(d.path, d.error) for d in downloads] == [
                ("/tmp/missing", "file_not_found"),
                ("/tmp/a/b.bin", None),
                ("/tmp/a", "is_directory"),
            ]
            assert downloads[1].content == bytes(range(256))
            timed_out = await backend.aexecute("echo started; sleep 30", timeout=2)
            assert timed_out.exit_code == 124 and "started" in timed_out.output
        finally:
            await backend.aclose()
        assert [s for s in await remote.sessions() if not s["closed"]] == []
