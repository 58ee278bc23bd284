"""What the integrations share: turning a result into text for a model, and sessions kept per
conversation key (thread id, execution id) on a Runner's scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exec_sandbox import ExecutionResult, Scheduler

from ._bridge import Runner

if TYPE_CHECKING:
    from exec_sandbox.session import Session

LANGUAGES = ("python", "javascript", "raw")


def result_text(result: ExecutionResult) -> str:
    """What a model reads: stdout, then stderr, then the exit code when it is not 0."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.exit_code != 0:
        parts.append(f"exit code: {result.exit_code}")
    return "\n".join(parts) if parts else "(no output)"


def result_artifact(result: ExecutionResult) -> dict[str, Any]:
    """The structured side of a result, for frameworks that carry one beside the text."""
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "execution_time_ms": result.execution_time_ms,
        "timing": {
            "setup_ms": result.timing.setup_ms,
            "boot_ms": result.timing.boot_ms,
            "execute_ms": result.timing.execute_ms,
            "total_ms": result.timing.total_ms,
        },
    }


class SessionPool:
    """One live Session per key, opened on first use, reopened if it closed (idle timeout, VM
    death). Every coroutine runs through the Runner, so the sessions live on one loop."""

    def __init__(self, runner: Runner, *, language: str = "python",
                 timeout_seconds: int | None = None,
                 packages: Sequence[str] | None = None) -> None:  # fmt: skip
        self.runner = runner
        self.language = language
        self.timeout_seconds = timeout_seconds
        self.packages = list(packages) if packages else None
        self._sessions: dict[str, Session] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def get(self, scheduler: Scheduler, key: str) -> Session:
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            session = self._sessions.get(key)
            if session is None or session.closed:
                session = await scheduler.session(
                    language=self.language,  # type: ignore[arg-type]
                    timeout_seconds=self.timeout_seconds,
                    packages=self.packages,
                )
                self._sessions[key] = session
            return session

    def keys(self) -> list[str]:
        return [key for key, session in self._sessions.items() if not session.closed]

    async def _close(self, key: str | None) -> None:
        keys = list(self._sessions) if key is None else [key]
        for name in keys:
            session = self._sessions.pop(name, None)
            if session is not None:
                await session.close()

    def close(self, key: str | None = None) -> None:
        """Close one key's session, or all of them. Idempotent."""
        if self._sessions:
            self.runner.run(lambda _s: self._close(key))

    async def aclose(self, key: str | None = None) -> None:
        if self._sessions:
            await self.runner.arun(lambda _s: self._close(key))
