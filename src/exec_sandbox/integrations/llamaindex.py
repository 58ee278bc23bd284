"""LlamaIndex: a `code_execute_fn` for `CodeActAgent` and `ExecSandboxToolSpec` (BaseToolSpec).

`create_code_execute_fn(tools=[...])` returns `async def code_execute_fn(code: str) -> str` that
runs every call in one VM session of its own, so variables persist across the agent's steps as
CodeActAgent's prompt says, and the agent's tools (give it the same list as the agent) are
callable from the code under the names the prompt shows, running on the host. Its `executor`
attribute (an `ExecSandboxCodeExecutor`) closes the VM. The tool spec runs each call in a fresh
VM.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from llama_index.core.tools import BaseTool, FunctionTool
from llama_index.core.tools.tool_spec.base import BaseToolSpec

from exec_sandbox import ExecutionResult, SandboxError, SandboxScheduler, Secret
from exec_sandbox.host_tools import ToolFunction

from ._bridge import Runner
from ._code_mode import ToolSessions, host_function, usable_name
from ._common import LANGUAGES, SessionPool, network_options, result_text

# The executor's one session, in a pool of its own: the key is never shared with another
# executor's.
_KEY = "codeact"
# CodeActAgent's own tools (the code executor itself, agent handoff): never callable from code.
_AGENT_TOOLS = ("execute", "handoff")


def code_tools(
    tools: Sequence[BaseTool | Callable[..., Any]] | None, language: str
) -> dict[str, ToolFunction]:
    """The agent's tools by the names code calls them: CodeActAgent's prompt shows a
    FunctionTool as `def <its function's __name__>(...)`, so that is its name; its tool name
    (`metadata.name`), when it differs and is free, calls it too. Plain functions go by
    `__name__`. Tools the agent itself refuses (not a FunctionTool, needing a Context) are
    refused here too, when the executor is made."""
    found: dict[str, ToolFunction] = {}
    aliases: list[tuple[str, ToolFunction]] = []
    for tool in tools or ():
        if isinstance(tool, FunctionTool):
            if tool.metadata.name in _AGENT_TOOLS:
                continue
            if tool.requires_context:
                raise ValueError(
                    f"tool {tool.metadata.name!r} needs a Context, which CodeActAgent does not "
                    "support"
                )
            wrapped = host_function(tool)
            if wrapped is None:  # a FunctionTool always is one; this tells mypy
                raise TypeError(f"not a tool: {tool!r}")
            fn, name = wrapped, getattr(tool.real_fn, "__name__", None)
            aliases.append((tool.metadata.get_name(), fn))
        elif isinstance(tool, BaseTool):
            raise TypeError(
                f"tool {tool.metadata.name!r} is not a FunctionTool: CodeActAgent supports only "
                "functions and FunctionTools"
            )
        elif callable(tool):
            fn, name = tool, getattr(tool, "__name__", None)
        else:
            raise TypeError(f"not a tool: {tool!r}")
        if not isinstance(name, str) or not usable_name(name, language):
            raise ValueError(f"tool {name!r} cannot be called by that name from {language} code")
        if name in found:
            raise ValueError(f"two tools are called {name!r}")
        found[name] = fn
    for alias, fn in aliases:
        if alias not in found and usable_name(alias, language):
            found[alias] = fn
    return found


class ExecSandboxCodeExecutor:
    """Owns the session behind a CodeActAgent's code_execute_fn. `execute` is the async function
    to hand to the agent; `close()` destroys the VM (a new one starts on the next call).

    One session per executor: every call of its `execute` (every run of the agent it serves)
    shares it, and no other executor does. For separate users or conversations, make one
    executor (and agent) each. `tools`: the agent's tools, callable from the code by name."""

    def __init__(
        self,
        scheduler: SandboxScheduler | None = None,
        *,
        timeout_seconds: int | None = None,
        language: str = "python",
        packages: Sequence[str] | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        secrets: Sequence[Secret] | None = None,
        http_headers: Mapping[str, Mapping[str, str]] | None = None,
        tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
    ) -> None:
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}: use one of {', '.join(LANGUAGES)}")
        self._tools = code_tools(tools, language)
        self._pool = SessionPool(
            Runner(scheduler),
            language=language,
            timeout_seconds=timeout_seconds,
            packages=packages,
            allow_network=allow_network,
            allowed_domains=allowed_domains,
            secrets=secrets,
            http_headers=http_headers,
        )
        self._sessions = ToolSessions(self._pool)
        weakref.finalize(self, _close_quietly, self._pool)

    @property
    def tool_names(self) -> list[str]:
        """The names the code can call the agent's tools by."""
        return sorted(self._tools)

    async def execute(self, code: str) -> str:
        """Run code in the persistent sandbox session and return what it printed."""
        try:
            result, note = await self._pool.runner.arun(lambda s: self._exec(s, code))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}"
        return result_text(result, note)

    async def _exec(self, scheduler: SandboxScheduler, code: str) -> tuple[ExecutionResult, str]:
        return await self._sessions.exec(scheduler, _KEY, code, self._tools, missing="key")

    def close(self) -> None:
        self._pool.close()

    async def aclose(self) -> None:
        await self._pool.aclose()


def create_code_execute_fn(
    scheduler: SandboxScheduler | None = None,
    *,
    timeout_seconds: int | None = None,
    language: str = "python",
    packages: Sequence[str] | None = None,
    allow_network: bool = False,
    allowed_domains: Sequence[str] | None = None,
    secrets: Sequence[Secret] | None = None,
    http_headers: Mapping[str, Mapping[str, str]] | None = None,
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
) -> Callable[[str], Awaitable[str]]:
    """The async `code_execute_fn(code: str) -> str` for CodeActAgent, with state kept across
    calls in a VM of its own (and `packages` installed). Pass the agent's `tools` here too: the
    code calls them by the names the agent's prompt shows, and they run on the host. The
    function's `executor` attribute holds its ExecSandboxCodeExecutor (to close)."""
    executor = ExecSandboxCodeExecutor(
        scheduler,
        timeout_seconds=timeout_seconds,
        language=language,
        packages=packages,
        allow_network=allow_network,
        allowed_domains=allowed_domains,
        secrets=secrets,
        http_headers=http_headers,
        tools=tools,
    )

    async def code_execute_fn(code: str) -> str:
        """Execute code in a sandboxed interpreter; state persists between calls."""
        return await executor.execute(code)

    code_execute_fn.executor = executor  # type: ignore[attr-defined]
    return code_execute_fn


class ExecSandboxToolSpec(BaseToolSpec):
    """Tools for a LlamaIndex agent: `run_code` runs code in a fresh, disposable VM."""

    spec_functions = [("run_code", "arun_code")]

    def __init__(
        self,
        scheduler: SandboxScheduler | None = None,
        *,
        timeout_seconds: int | None = None,
        packages: Sequence[str] | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        secrets: Sequence[Secret] | None = None,
        http_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self._runner = Runner(scheduler)
        self._network = network_options(allow_network, allowed_domains, secrets, http_headers)
        self._timeout = timeout_seconds
        # Installed for python runs (pinned names, name==version).
        self._packages = list(packages) if packages else None

    def run_code(self, code: str, language: str = "python") -> str:
        """Run code in an isolated sandbox VM and return its output.

        Args:
            code: the source code to run.
            language: python, javascript, typescript (runs as javascript, types stripped) or
                raw (a bash script).
        """
        if language not in LANGUAGES:
            return f"Error: unknown language {language!r}: use one of {', '.join(LANGUAGES)}"
        try:
            result = self._runner.run(
                lambda s: s.run(
                    code,
                    language=language,  # type: ignore[arg-type]
                    timeout_seconds=self._timeout,
                    packages=self._packages if language == "python" else None,
                    **self._network,
                )
            )
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}"
        return result_text(result)

    async def arun_code(self, code: str, language: str = "python") -> str:
        """Async form of run_code (used by async agents)."""
        if language not in LANGUAGES:
            return f"Error: unknown language {language!r}: use one of {', '.join(LANGUAGES)}"
        try:
            result = await self._runner.arun(
                lambda s: s.run(
                    code,
                    language=language,  # type: ignore[arg-type]
                    timeout_seconds=self._timeout,
                    packages=self._packages if language == "python" else None,
                    **self._network,
                )
            )
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}"
        return result_text(result)


def _close_quietly(pool: SessionPool) -> None:
    try:
        pool.close()
    except Exception:
        pass
