"""langgraph-codeact: eval functions that run the agent's code blocks in exec-sandbox VMs.

`eval_fn(code, _locals) -> (output, new_vars)` is the contract. create_codeact puts the agent's
tools in `_locals` by name and its prompt shows them to the model as plain functions; the code
calls them under those names, and each call runs on the host (`tools={...}` of the sandbox, see
_code_mode). Other host objects cannot cross into a VM, so `new_vars` is always empty and the
variables live in the VM instead: `ExecSandboxSessionEval` keeps one VM per LangGraph thread, so
top-level variables persist between code blocks as the default prompt promises; with the
stateless functions each block starts from a clean VM.

Network: off by default; `allow_network` and `allowed_domains` mean what they mean for
Scheduler.run() and are checked when the eval function is made, before any VM.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from exec_sandbox import ExecutionResult, SandboxError, SandboxScheduler
from exec_sandbox.host_tools import ToolFunction

from ._bridge import Runner
from ._code_mode import ToolSessions, host_function, offered, usable_name, with_binding
from ._common import LANGUAGES, SessionPool, network_options, result_text

EvalFn = Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]
AsyncEvalFn = Callable[[str, dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]


def _check(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}: use one of {', '.join(LANGUAGES)}")


def _given_tools(tools: Sequence[Any] | None, language: str) -> dict[str, ToolFunction]:
    """The tools passed to the eval function itself, by the name the code calls them: needed
    for what `_locals` lacks (create_codeact puts `tool.func` there, None for a tool that has
    only a coroutine) and for LangChain tools to run with their own `ainvoke`."""
    found: dict[str, ToolFunction] = {}
    for tool in tools or ():
        fn = host_function(tool)
        name = getattr(fn, "__name__", None)
        if fn is None or not isinstance(name, str):
            raise TypeError(f"not a tool: {tool!r} (pass LangChain tools or functions)")
        if not usable_name(name, language):
            raise ValueError(f"tool name {name!r} cannot be called from {language} code")
        found[name] = fn
    return found


def _agent_tools(
    _locals: Mapping[str, Any] | None, given: Mapping[str, ToolFunction], language: str
) -> dict[str, ToolFunction]:
    """The block's tools: every callable create_codeact put in `_locals` under a name code can
    call, with the eval function's own `tools` in place of those of the same name."""
    found: dict[str, ToolFunction] = {}
    for name, value in (_locals or {}).items():
        if name in given or not usable_name(name, language):
            continue
        fn = host_function(value)
        if fn is not None:
            found[name] = fn
    found.update(given)
    return found


def _output(call: Callable[[], ExecutionResult]) -> str:
    try:
        return result_text(call())
    except SandboxError as exc:
        # The model reads this and can fix its code (empty block, bad input) or retry.
        return f"Error: {type(exc).__name__}: {exc}"


def _one_shot(
    language: str,
    timeout_seconds: int | None,
    allow_network: bool,
    allowed_domains: Sequence[str] | None,
    tools: Sequence[Any] | None,
) -> Callable[[str, dict[str, Any]], Callable[[SandboxScheduler], Awaitable[ExecutionResult]]]:
    """The run() call of one code block, with the eval function's settings checked now (before
    any VM: a bad setting fails where the eval function is made)."""
    _check(language)
    network = network_options(allow_network, allowed_domains)
    given = _given_tools(tools, language)

    def call(
        code: str, _locals: dict[str, Any]
    ) -> Callable[[SandboxScheduler], Awaitable[ExecutionResult]]:
        host = offered(language, _agent_tools(_locals, given, language))
        source = with_binding(language, code, host or {})
        return lambda s: s.run(
            source,
            language=language,  # type: ignore[arg-type]
            timeout_seconds=timeout_seconds,
            tools=host,
            **network,
        )

    return call


def create_exec_sandbox_eval(
    scheduler: SandboxScheduler | None = None,
    *,
    timeout_seconds: int | None = None,
    language: str = "python",
    allow_network: bool = False,
    allowed_domains: Sequence[str] | None = None,
    tools: Sequence[Any] | None = None,
) -> EvalFn:
    """A synchronous eval_fn: each code block runs in a fresh VM, so nothing persists between
    blocks (create_codeact's default prompt says variables do: use ExecSandboxSessionEval with
    it, or a prompt of your own). The agent's tools (from `_locals`, and `tools` given here, e.g.
    the same list as create_codeact's) are callable by name from the code and run on the host."""
    call = _one_shot(language, timeout_seconds, allow_network, allowed_domains, tools)
    runner = Runner(scheduler)

    def eval_fn(code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return _output(lambda: runner.run(call(code, _locals))), {}

    return eval_fn


def create_exec_sandbox_async_eval(
    scheduler: SandboxScheduler | None = None,
    *,
    timeout_seconds: int | None = None,
    language: str = "python",
    allow_network: bool = False,
    allowed_domains: Sequence[str] | None = None,
    tools: Sequence[Any] | None = None,
) -> AsyncEvalFn:
    """An `async def` eval_fn: each code block runs in a fresh VM (as create_exec_sandbox_eval)."""
    call = _one_shot(language, timeout_seconds, allow_network, allowed_domains, tools)
    runner = Runner(scheduler)

    async def eval_fn(code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        try:
            result = await runner.arun(call(code, _locals))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}", {}
        return result_text(result), {}

    return eval_fn


class ExecSandboxSessionEval:
    """Session-backed eval: one VM per LangGraph thread (`thread_id` of the run's config), so
    variables, imports and files persist across the code blocks and turns of that thread, as
    create_codeact's prompt tells the model.

    Pass `.eval` (sync) or `.aeval` (async) as create_codeact's eval_fn; `close()` destroys the
    VMs. Abandoned ones close after the scheduler's idle timeout, or at exit. A call without a
    thread id runs in a VM of its own, closed after it; the output says so.

    The agent's tools are callable by name from the code and run on the host: every callable in
    `_locals` (create_codeact puts each tool's function there) and `tools` given here (LangChain
    tools or functions, e.g. the list given to create_codeact; needed for a tool with only a
    coroutine, which create_codeact passes as None). A thread's VM offers the tools of its first
    block.
    """

    def __init__(
        self,
        scheduler: SandboxScheduler | None = None,
        *,
        timeout_seconds: int | None = None,
        language: str = "python",
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        tools: Sequence[Any] | None = None,
    ) -> None:
        _check(language)
        self._given = _given_tools(tools, language)
        self._pool = SessionPool(
            Runner(scheduler),
            language=language,
            timeout_seconds=timeout_seconds,
            allow_network=allow_network,
            allowed_domains=allowed_domains,
        )
        self._sessions = ToolSessions(self._pool)
        weakref.finalize(self, _close_quietly, self._pool)

    def eval(self, code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        key = _thread_id()
        tools = _agent_tools(_locals, self._given, self._pool.language)
        try:
            result, note = self._pool.runner.run(lambda s: self._exec(s, key, code, tools))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}", {}
        return result_text(result, note), {}

    async def aeval(self, code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        key = _thread_id()
        tools = _agent_tools(_locals, self._given, self._pool.language)
        try:
            result, note = await self._pool.runner.arun(lambda s: self._exec(s, key, code, tools))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}", {}
        return result_text(result, note), {}

    async def _exec(
        self,
        scheduler: SandboxScheduler,
        key: str | None,
        code: str,
        tools: Mapping[str, ToolFunction],
    ) -> tuple[ExecutionResult, str]:
        return await self._sessions.exec(scheduler, key, code, tools, missing="LangGraph thread_id")

    @property
    def thread_ids(self) -> list[str]:
        return self._pool.keys()

    def close(self, thread_id: str | None = None) -> None:
        self._pool.close(thread_id)

    async def aclose(self, thread_id: str | None = None) -> None:
        await self._pool.aclose(thread_id)


def _thread_id() -> str | None:
    """The thread of the LangGraph run calling us, or None (outside a run, or a run without a
    thread id): such a call gets a VM of its own, never one shared by all callers without one."""
    try:
        from langgraph.config import get_config

        configurable = get_config().get("configurable") or {}
    except (ImportError, RuntimeError):
        return None
    thread = configurable.get("thread_id")
    return None if thread is None or thread == "" else str(thread)


def _close_quietly(pool: SessionPool) -> None:
    try:
        pool.close()
    except Exception:
        pass
