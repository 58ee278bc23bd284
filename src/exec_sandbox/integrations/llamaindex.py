"""LlamaIndex: a `code_execute_fn` for `CodeActAgent` and `ExecSandboxToolSpec` (BaseToolSpec).

`create_code_execute_fn()` returns `async def code_execute_fn(code: str) -> str` that runs every
call in one VM session, so variables persist across the agent's steps; its `executor` attribute
(an `ExecSandboxCodeExecutor`) closes the VM. The tool spec runs each call in a fresh VM.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Sequence

from llama_index.core.tools.tool_spec.base import BaseToolSpec

from exec_sandbox import ExecutionResult, SandboxError, SandboxScheduler

from ._bridge import Runner
from ._common import LANGUAGES, SessionPool, network_options, result_text

_KEY = "codeact"


class ExecSandboxCodeExecutor:
    """Owns the session behind a CodeActAgent's code_execute_fn. `execute` is the async function
    to hand to the agent; `close()` destroys the VM (a new one starts on the next call)."""

    def __init__(
        self,
        scheduler: SandboxScheduler | None = None,
        *,
        timeout_seconds: int | None = None,
        language: str = "python",
        packages: Sequence[str] | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
    ) -> None:
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}: use one of {', '.join(LANGUAGES)}")
        self._pool = SessionPool(
            Runner(scheduler),
            language=language,
            timeout_seconds=timeout_seconds,
            packages=packages,
            allow_network=allow_network,
            allowed_domains=allowed_domains,
        )
        weakref.finalize(self, _close_quietly, self._pool)

    async def execute(self, code: str) -> str:
        """Run code in the persistent sandbox session and return what it printed."""
        try:
            result, note = await self._pool.runner.arun(lambda s: self._exec(s, code))
        except SandboxError as exc:
            return f"Error: {type(exc).__name__}: {exc}"
        return result_text(result, note)

    async def _exec(self, scheduler: SandboxScheduler, code: str) -> tuple[ExecutionResult, str]:
        return await self._pool.exec(scheduler, _KEY, code, missing="key")

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
) -> Callable[[str], Awaitable[str]]:
    """The async `code_execute_fn(code: str) -> str` for CodeActAgent, with state kept across
    calls (and `packages` installed). The function's `executor` attribute holds its
    ExecSandboxCodeExecutor (to close)."""
    executor = ExecSandboxCodeExecutor(
        scheduler,
        timeout_seconds=timeout_seconds,
        language=language,
        packages=packages,
        allow_network=allow_network,
        allowed_domains=allowed_domains,
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
    ) -> None:
        self._runner = Runner(scheduler)
        self._network = network_options(allow_network, allowed_domains)
        self._timeout = timeout_seconds
        # Installed for python runs (pinned names, name==version).
        self._packages = list(packages) if packages else None

    def run_code(self, code: str, language: str = "python") -> str:
        """Run code in an isolated sandbox VM and return its output.

        Args:
            code: the source code to run.
            language: python, javascript or raw (a bash script).
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
