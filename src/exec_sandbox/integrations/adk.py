"""Google ADK: `ExecSandboxCodeExecutor` runs an agent's code blocks in exec-sandbox VMs.

ADK calls `execute_code` synchronously, possibly from inside its running event loop; the work
is sent to the shared background scheduler's own loop thread, so the caller's loop is never
re-entered (no deadlock). With `stateful=True`, one VM per `execution_id` keeps variables between
calls; otherwise each call gets a fresh VM. `input_files` are written into the guest home before
the code runs; files that appear in the home during the run come back as `output_files`; stderr is
reported only when the code failed (ADK counts any stderr as an error and retries).
"""

from __future__ import annotations

import base64
import mimetypes
import weakref
from typing import TYPE_CHECKING, Any

from google.adk.code_executors.base_code_executor import BaseCodeExecutor
from google.adk.code_executors.code_execution_utils import (
    CodeExecutionInput,
    CodeExecutionResult,
    File,
)
from pydantic import ConfigDict, PrivateAttr

from exec_sandbox import SandboxError, Scheduler

from ._bridge import Runner
from ._common import SessionPool

if TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext

    from exec_sandbox.session import Session

# Output files larger than this are left out (ADK stores them as artifacts in memory).
MAX_OUTPUT_FILE_BYTES = 32 * 1024 * 1024


class ExecSandboxCodeExecutor(BaseCodeExecutor):
    """A BaseCodeExecutor backed by exec-sandbox microVMs (Python code)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scheduler: Scheduler | None = None
    timeout_seconds: int | None = None
    _pool: SessionPool = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._pool = SessionPool(Runner(self.scheduler), language="python",
                                 timeout_seconds=self.timeout_seconds)  # fmt: skip
        weakref.finalize(self, _close_quietly, self._pool)

    def execute_code(self, invocation_context: InvocationContext,
                     code_execution_input: CodeExecutionInput) -> CodeExecutionResult:  # fmt: skip
        return self._pool.runner.run(lambda s: self._execute(s, code_execution_input))

    async def execute_code_async(self, invocation_context: InvocationContext,
                                 code_execution_input: CodeExecutionInput
                                 ) -> CodeExecutionResult:  # fmt: skip
        """Awaitable form of execute_code for callers that have a loop to spare."""
        return await self._pool.runner.arun(lambda s: self._execute(s, code_execution_input))

    async def _execute(self, scheduler: Scheduler,
                       request: CodeExecutionInput) -> CodeExecutionResult:  # fmt: skip
        key = request.execution_id if self.stateful and request.execution_id else None
        try:
            if key is not None:
                session = await self._pool.get(scheduler, key)
            else:
                session = await scheduler.session(language="python",
                                                  timeout_seconds=self.timeout_seconds)  # fmt: skip
            try:
                return await _run(session, request)
            finally:
                if key is None:
                    await session.close()
        except SandboxError as exc:
            return CodeExecutionResult(stderr=f"{type(exc).__name__}: {exc}", exit_code=None)

    def close(self, execution_id: str | None = None) -> None:
        """Destroy the VM of one execution id, or all of them."""
        self._pool.close(execution_id)


async def _run(session: Session, request: CodeExecutionInput) -> CodeExecutionResult:
    for file in request.input_files:
        await session.write_file(file.name, _file_bytes(file.content))
    before = {entry.name: entry.size for entry in await session.list_files()}
    result = await session.exec(request.code)
    outputs = []
    for entry in await session.list_files():
        if entry.is_dir or entry.name in before or entry.size > MAX_OUTPUT_FILE_BYTES:
            continue
        data = await session.read_file(entry.name)
        assert data is not None
        mime = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
        outputs.append(File(name=entry.name, content=data, mime_type=mime))
    return CodeExecutionResult(
        stdout=result.stdout,
        stderr=result.stderr if result.exit_code != 0 else "",
        output_files=outputs,
        exit_code=result.exit_code,
    )


def _file_bytes(content: str | bytes) -> bytes:
    """ADK's File.content is raw bytes or base64 text."""
    if isinstance(content, bytes):
        return content
    return base64.b64decode(content)


def _close_quietly(pool: SessionPool) -> None:
    try:
        pool.close()
    except Exception:  # noqa: BLE001 - at interpreter exit the loop may already be gone
        pass
