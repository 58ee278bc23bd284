"""The integrations take allow_network / allowed_domains like run(), and refuse bad values
when the tool is made (no VM involved; the real-VM checks are in tests/integration/network/
test_integrations_network.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from exec_sandbox import ExecutionResult
from exec_sandbox.network import NetworkValidationError


def test_langchain_tool() -> None:
    pytest.importorskip("langchain_core", reason="the [langchain] extra is not installed")
    from exec_sandbox.integrations.langchain import ExecSandboxSessionTool, ExecSandboxTool

    tool = ExecSandboxTool(allow_network=True, allowed_domains=["api.github.com"])
    assert tool._network == {"allow_network": True, "allowed_domains": ["api.github.com"]}
    # pydantic models report it as a ValidationError (a ValueError) carrying the same message.
    with pytest.raises(ValueError, match="wildcard"):
        ExecSandboxTool(allow_network=True, allowed_domains=["*"])
    with pytest.raises(ValueError, match="URL"):
        ExecSandboxSessionTool(allow_network=True, allowed_domains=["https://x.org"])


def test_deepagents_backend() -> None:
    pytest.importorskip("deepagents", reason="the [deepagents] extra is not installed")
    from exec_sandbox.integrations.deepagents import ExecSandboxBackend

    backend = ExecSandboxBackend(
        memory_mb=512, allow_network=True, allowed_domains=["api.github.com"]
    )
    assert backend._network["allowed_domains"] == ["api.github.com"]
    with pytest.raises(NetworkValidationError, match="allow_network=True"):
        ExecSandboxBackend(allowed_domains=["api.github.com"])


def test_adk_executor() -> None:
    pytest.importorskip("google.adk", reason="the [adk] extra is not installed")
    from exec_sandbox.integrations.adk import ExecSandboxCodeExecutor

    executor = ExecSandboxCodeExecutor(allow_network=True, allowed_domains=["example.org"])
    assert executor._pool.network["allow_network"] is True
    with pytest.raises(ValueError, match="white space"):  # pydantic's ValidationError
        ExecSandboxCodeExecutor(allow_network=True, allowed_domains=["a b.org"])


def test_llamaindex() -> None:
    pytest.importorskip("llama_index.core", reason="the [llamaindex] extra is not installed")
    from exec_sandbox.integrations.llamaindex import ExecSandboxToolSpec, create_code_execute_fn

    spec = ExecSandboxToolSpec(allow_network=True, allowed_domains=["example.org"])
    assert spec._network["allow_network"] is True
    fn = create_code_execute_fn(allow_network=True)
    assert fn.executor._pool.network == {"allow_network": True, "allowed_domains": None}  # type: ignore[attr-defined]
    with pytest.raises(NetworkValidationError):
        ExecSandboxToolSpec(allow_network=True, allowed_domains=["x" * 300])


class _RecordingScheduler:
    """STAND-IN for a Scheduler (orchestration only, no VM): records the keyword arguments of
    run() and session() and answers with a printed line."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    async def run(self, code: str, **kwargs: object) -> object:
        self.calls.append(("run", kwargs))
        return ExecutionResult(stdout="ran\n", stderr="", exit_code=0)

    async def session(self, **kwargs: object) -> object:
        self.calls.append(("session", kwargs))

        async def exec(code: str) -> object:
            return ExecutionResult(stdout="ran\n", stderr="", exit_code=0)

        async def close() -> None:
            pass

        return SimpleNamespace(closed=False, exec=exec, close=close)


@pytest.mark.parametrize("kind", ["sync", "async", "session"])
async def test_codeact_eval_functions_pass_the_network_to_the_vm_call(kind: str) -> None:
    from exec_sandbox.integrations import codeact

    sched = _RecordingScheduler()
    network = {"allow_network": True, "allowed_domains": ["api.github.com"]}
    if kind == "sync":
        # A sync eval_fn waits for the scheduler's loop: call it from another thread.
        fn = codeact.create_exec_sandbox_eval(sched, **network)  # type: ignore[arg-type]
        out = await asyncio.to_thread(fn, "print(1)", {})
    elif kind == "async":
        afn = codeact.create_exec_sandbox_async_eval(sched, **network)  # type: ignore[arg-type]
        out = await afn("print(1)", {})
    else:
        evaluator = codeact.ExecSandboxSessionEval(sched, **network)  # type: ignore[arg-type]
        # Outside a LangGraph run: a session of its own, and a note saying so.
        text, new_vars = await evaluator.aeval("print(1)", {})
        out = (text.split("\n")[-1], new_vars)
        assert text.startswith("[sandbox note: no LangGraph thread_id")
    assert out == ("ran", {})
    ((call, kwargs),) = sched.calls
    assert call == ("session" if kind == "session" else "run")
    assert (kwargs["allow_network"], kwargs["allowed_domains"]) == (True, ["api.github.com"])


@pytest.mark.parametrize(
    "make", ["create_exec_sandbox_eval", "create_exec_sandbox_async_eval", "ExecSandboxSessionEval"]
)
def test_codeact_refuses_bad_network_settings_before_any_vm(make: str) -> None:
    from exec_sandbox.integrations import codeact

    factory = getattr(codeact, make)
    with pytest.raises(NetworkValidationError, match="allow_network=True"):
        factory(allowed_domains=["api.github.com"])
    with pytest.raises(NetworkValidationError, match="URL"):
        factory(allow_network=True, allowed_domains=["https://api.github.com"])
    with pytest.raises(NetworkValidationError, match="wildcard"):
        factory(allow_network=True, allowed_domains=["*"])


def test_secrets_reach_every_integration_and_are_checked_when_made() -> None:
    """secrets= / http_headers= go with the network options of each integration; a secret whose
    host is not allowed fails when the tool is made, without its value in the message."""
    from exec_sandbox import Secret

    secret = Secret("API_KEY", "value-xyz", ["api.example.org"])
    rules = {"api.example.org": {"X-Team": "t"}}
    made: list[dict[str, object]] = []
    bad = Secret("API_KEY", "value-xyz", ["other.org"])
    if _has("langchain_core"):
        from exec_sandbox.integrations.langchain import ExecSandboxTool

        tool = ExecSandboxTool(allow_network=True, secrets=[secret], http_headers=rules)
        made.append(dict(tool._network))
        with pytest.raises(ValueError, match="not allowed") as info:
            ExecSandboxTool(allow_network=True, allowed_domains=["x.org"], secrets=[bad])
        assert "value-xyz" not in str(info.value)
    if _has("deepagents"):
        from exec_sandbox.integrations.deepagents import ExecSandboxBackend

        backend = ExecSandboxBackend(allow_network=True, secrets=[secret], http_headers=rules)
        made.append(dict(backend._network))
    if _has("google.adk"):
        from exec_sandbox.integrations.adk import ExecSandboxCodeExecutor

        executor = ExecSandboxCodeExecutor(allow_network=True, secrets=[secret], http_headers=rules)
        made.append(dict(executor._pool.network))
    if _has("llama_index.core"):
        from exec_sandbox.integrations.llamaindex import (
            ExecSandboxToolSpec,
            create_code_execute_fn,
        )

        spec = ExecSandboxToolSpec(allow_network=True, secrets=[secret], http_headers=rules)
        made.append(dict(spec._network))
        fn = create_code_execute_fn(allow_network=True, secrets=[secret], http_headers=rules)
        made.append(dict(fn.executor._pool.network))  # type: ignore[attr-defined]
        with pytest.raises(NetworkValidationError, match="not allowed"):
            ExecSandboxToolSpec(allow_network=True, allowed_domains=["x.org"], secrets=[bad])
    if not made:
        pytest.skip("no integration extra is installed")
    for options in made:
        assert [s.name for s in options["secrets"]] == ["API_KEY"]  # type: ignore[attr-defined]
        assert options["http_headers"] == rules


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
