"""langgraph-codeact: eval functions that run the agent's code blocks in exec-sandbox VMs.

`eval_fn(code, _locals) -> (output, new_vars)` is the contract. The VM cannot receive host Python
objects, so `_locals` (the agent's tools and earlier variables) is not passed in and `new_vars` is
always empty: with the stateless functions each block starts from a clean VM; with
`ExecSandboxSessionEval` the variables stay alive inside the thread's VM instead.

Network: off by default; `allow_network` and `allowed_domains` mean what they mean for
Scheduler.run() and are checked when the eval function is made, before any VM.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from exec_sandbox import ExecutionResult, SandboxError, SandboxScheduler

from ._bridge import Runner
from ._common import LANGUAGES, SessionPool, network_options, result_text

EvalFn = Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]
AsyncEvalFn = Callable[[str, dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]


def _check(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}: use one of {', '.join(LANGUAGES)}")


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
) -> Callable[[str], Callable[[SandboxScheduler], Awaitable[ExecutionResult]]]:
    """The run() call of one code block, with the eval function's settings checked now (before
    any VM: a bad setting fails where the eval function is made)."""
    _check(language)
    network = network_options(allow_network, allowed_domains)

    def call(code: str) -> Callable[[SandboxScheduler], Awaitable[ExecutionResult]]:
        return lambda s: s.run(
            code,
            language=language,  # type: ignore[arg-type]
            timeout_seconds=timeout_seconds,
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
) -> EvalFn:
    """A synchronous eval_fn: each code block runs in a fresh VM."""
    call = _one_shot(language, timeout_seconds, allow_network, allowed_domains)
    runner = Runner(scheduler)

    def eval_fn(code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return _output(lambda: runner.run(call(code))), {}

    return eval_fn


def create_exec_sandbox_async_eval(
    scheduler: SandboxScheduler | None = None,
    *,
    timeout_seconds: int | None = None,
    language: str = "python",
    allow_network: bool = False,
    allowed_domains: Sequence[str] | None = None,
) -> AsyncEvalFn:
    """An `async def` eval_fn: each code block runs in a fresh VM."""
    call = _one_shot(language, timeout_seconds, allow_network, allowed_domains)
    runner = Runner(scheduler)

    async def eval_fn(code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        try:
            result = await runner.arun(call(code))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}", {}
        return result_text(result), {}

    return eval_fn


class ExecSandboxSessionEval:
    """Session-backed eval: one VM per LangGraph thread (`thread_id` of the run's config), so
    variables, imports and files persist across the turns of that thread.

    Pass `.eval` (sync) or `.aeval` (async) as create_codeact's eval_fn; `close()` destroys the
    VMs. Abandoned ones close after the scheduler's idle timeout, or at exit. A call without a
    thread id runs in a VM of its own, closed after it; the output says so.
    """

    def __init__(
        self,
        scheduler: SandboxScheduler | None = None,
        *,
        timeout_seconds: int | None = None,
        language: str = "python",
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
    ) -> None:
        _check(language)
        self._pool = SessionPool(
            Runner(scheduler),
            language=language,
            timeout_seconds=timeout_seconds,
            allow_network=allow_network,
            allowed_domains=allowed_domains,
        )
        weakref.finalize(self, _close_quietly, self._pool)

    def eval(self, code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        key = _thread_id()
        try:
            result, note = self._pool.runner.run(lambda s: self._exec(s, key, code))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}", {}
        return result_text(result, note), {}

    async def aeval(self, code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        key = _thread_id()
        try:
            result, note = await self._pool.runner.arun(lambda s: self._exec(s, key, code))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}", {}
        return result_text(result, note), {}

    async def _exec(
        self, scheduler: SandboxScheduler, key: str | None, code: str
    ) -> tuple[ExecutionResult, str]:
        return await self._pool.exec(scheduler, key, code, missing="LangGraph thread_id")

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
