"""The integrations take allow_network / allowed_domains like run(), and refuse bad values
when the tool is made (no VM involved)."""

from __future__ import annotations

import pytest

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

    backend = ExecSandboxBackend(memory_mb=512, allow_network=True,
                                 allowed_domains=["api.github.com"])  # fmt: skip
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
