"""The framework integrations' network arguments, end to end in real VMs: the LangChain tool, the
Deep Agents backend and the CodeAct eval functions reach an allowed name (a loopback server,
conftest.py) and not another."""

from __future__ import annotations

import pytest

from exec_sandbox import Scheduler

from .conftest import BODY

pytestmark = pytest.mark.vm

CURL = "curl -sS --max-time 20 http://{}/hello"


async def test_langchain_tool_reaches_only_its_allowed_names(net_scheduler: Scheduler) -> None:
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
    from exec_sandbox.integrations.langchain import ExecSandboxTool

    tool = ExecSandboxTool(
        scheduler=net_scheduler, allow_network=True, allowed_domains=["web.test"]
    )
    allowed = await tool.ainvoke({"code": CURL.format("web.test"), "language": "raw"})
    assert allowed == BODY.decode().strip()  # the tool strips trailing whitespace
    refused = await tool.ainvoke({"code": CURL.format("elsewhere.test"), "language": "raw"})
    assert "Could not resolve host" in refused and "exit code: 6" in refused


async def test_deepagents_backend_reaches_only_its_allowed_names(net_scheduler: Scheduler) -> None:
    pytest.importorskip("deepagents", reason="the deepagents extra is not installed")
    from exec_sandbox.integrations.deepagents import ExecSandboxBackend

    backend = ExecSandboxBackend(net_scheduler, allow_network=True, allowed_domains=["web.test"])
    try:
        allowed = await backend.aexecute(CURL.format("web.test"))
        assert (allowed.exit_code, allowed.output) == (0, BODY.decode())
        refused = await backend.aexecute(CURL.format("elsewhere.test"))
        assert refused.exit_code == 6 and "Could not resolve host" in refused.output
    finally:
        await backend.aclose()


async def test_codeact_eval_reaches_only_its_allowed_names(net_scheduler: Scheduler) -> None:
    from exec_sandbox.integrations.codeact import create_exec_sandbox_async_eval

    eval_fn = create_exec_sandbox_async_eval(
        net_scheduler, language="raw", allow_network=True, allowed_domains=["web.test"]
    )
    allowed, new_vars = await eval_fn(CURL.format("web.test"), {})
    assert (allowed, new_vars) == (BODY.decode().rstrip("\n"), {})
    refused, _ = await eval_fn(CURL.format("elsewhere.test"), {})
    assert "Could not resolve host" in refused and "exit code: 6" in refused


async def test_codeact_session_eval_reaches_only_its_allowed_names(
    net_scheduler: Scheduler,
) -> None:
    from exec_sandbox.integrations.codeact import ExecSandboxSessionEval

    evaluator = ExecSandboxSessionEval(
        net_scheduler, allow_network=True, allowed_domains=["web.test"]
    )
    fetch = (
        "import urllib.request\n"
        "try:\n"
        "    print(urllib.request.urlopen('http://{}/hello', timeout=20).read().decode())\n"
        "except OSError as exc:\n"
        "    print('FAILED', exc)\n"
    )
    try:
        # No thread id: each call runs in a VM of its own, and the text says so on its first
        # line (integrations/_common.py); the code's output follows.
        allowed, _ = await evaluator.aeval(fetch.format("web.test"), {})
        assert allowed.splitlines()[-1] == BODY.decode().rstrip("\n")
        refused, _ = await evaluator.aeval(fetch.format("elsewhere.test"), {})
        assert refused.splitlines()[-1].startswith("FAILED")
    finally:
        await evaluator.aclose()
