"""Google ADK: `ExecSandboxCodeExecutor` runs an agent's code blocks in exec-sandbox VMs.

ADK calls `execute_code` synchronously, possibly from inside its running event loop; the work
is sent to the shared background scheduler's own loop thread, so the caller's loop is never
re-entered (no deadlock). With `stateful=True`, one VM per `execution_id` keeps variables between
calls; otherwise each call gets a fresh VM. `input_files` are written into the guest home before
the code runs; files that appear in the home or its subdirectories during the run come back as
`output_files` (named by their path under the home; bounded, see `_new_files`); stderr is
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

from exec_sandbox import SandboxError, SandboxScheduler

from ._bridge import Runner
from ._common import SessionPool

if TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext

    from exec_sandbox import SandboxSession

# ADK keeps output files in memory as artifacts: bounded per file, in number and in total. A
# file left out is named in a note appended to stdout, so the model knows it exists.
MAX_OUTPUT_FILE_BYTES = 32 * 1024 * 1024
MAX_OUTPUT_FILES = 64
MAX_OUTPUT_TOTAL_BYTES = 64 * 1024 * 1024
# The search for new files: one guest round trip per directory, so bounded in directories and
# depth; dot-directories and __pycache__ (tool caches, not results) are not entered.
MAX_SCANNED_DIRS = 256
MAX_SCAN_DEPTH = 8


class ExecSandboxCodeExecutor(BaseCodeExecutor):
    """A BaseCodeExecutor backed by exec-sandbox microVMs (Python code)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scheduler: SandboxScheduler | None = None
    timeout_seconds: int | None = None
    # Python packages installed in the VM (name==version), e.g. ["pandas==2.2.0"].
    packages: list[str] | None = None
    # stateful executors: close() pauses each execution id's session to disk, and the same id
    # resumes it later, also in a new process (an agent's thread gets its variables and files
    # back after a restart).
    persist_sessions: bool = False
    # Network by name (Scheduler.session): off by default; allowed_domains None = any public name.
    allow_network: bool = False
    allowed_domains: list[str] | None = None
    _pool: SessionPool = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._pool = SessionPool(
            Runner(self.scheduler),
            language="python",
            timeout_seconds=self.timeout_seconds,
            packages=self.packages,
            persist="adk" if self.persist_sessions else None,
            allow_network=self.allow_network,
            allowed_domains=self.allowed_domains,
        )
        weakref.finalize(self, _close_quietly, self._pool)

    def execute_code(
        self, invocation_context: InvocationContext, code_execution_input: CodeExecutionInput
    ) -> CodeExecutionResult:
        return self._pool.runner.run(lambda s: self._execute(s, code_execution_input))

    async def execute_code_async(
        self, invocation_context: InvocationContext, code_execution_input: CodeExecutionInput
    ) -> CodeExecutionResult:
        """Awaitable form of execute_code for callers that have a loop to spare."""
        return await self._pool.runner.arun(lambda s: self._execute(s, code_execution_input))

    async def _execute(
        self, scheduler: SandboxScheduler, request: CodeExecutionInput
    ) -> CodeExecutionResult:
        key = request.execution_id if self.stateful and request.execution_id else None
        try:
            note = ""
            if key is not None:
                session = await self._pool.get(scheduler, key)
                note = self._pool.take_note(key)
            else:
                session = await self._pool.open(scheduler)
            try:
                result = await _run(session, request)
                if note:  # ADK shows the model stdout: the note goes first
                    result.stdout = f"{note}\n{result.stdout}"
                return result
            finally:
                if key is None:
                    await session.close()
        except SandboxError as exc:
            return CodeExecutionResult(stderr=f"{type(exc).__name__}: {exc}", exit_code=None)

    def close(self, execution_id: str | None = None) -> None:
        """Destroy the VM of one execution id, or all of them (with persist_sessions: pause them
        to disk instead, to be resumed by the next call with that id)."""
        self._pool.close(execution_id)


async def _run(session: SandboxSession, request: CodeExecutionInput) -> CodeExecutionResult:
    for file in request.input_files:
        await session.write_file(file.name, _file_bytes(file.content))
    before = await _scan(session)
    result = await session.exec(request.code)
    outputs, left_out = await _new_files(session, before)
    stdout = result.stdout
    if left_out:
        stdout += (
            f"\n[exec-sandbox: {len(left_out)} new file(s) not returned (limits: "
            f"{MAX_OUTPUT_FILES} files, {MAX_OUTPUT_FILE_BYTES >> 20} MiB each, "
            f"{MAX_OUTPUT_TOTAL_BYTES >> 20} MiB in all): {', '.join(left_out[:10])}]\n"
        )
    return CodeExecutionResult(
        stdout=stdout,
        stderr=result.stderr if result.exit_code != 0 else "",
        output_files=outputs,
        exit_code=result.exit_code,
    )


async def _scan(session: SandboxSession) -> dict[str, int]:
    """Files under the home, path -> size, breadth first within the scan bounds."""
    found: dict[str, int] = {}
    pending, scanned = [("", 0)], 0
    while pending and scanned < MAX_SCANNED_DIRS:
        directory, depth = pending.pop(0)
        scanned += 1
        for entry in await session.list_files(directory):
            if entry.name in ("", ".", "..") or "/" in entry.name:
                continue  # not a name a well-behaved guest reports
            path = f"{directory}/{entry.name}" if directory else entry.name
            if not entry.is_dir:
                found[path] = entry.size
            elif depth < MAX_SCAN_DEPTH and not _is_cache_dir(entry.name):
                pending.append((path, depth + 1))
    return found


async def _new_files(
    session: SandboxSession, before: dict[str, int]
) -> tuple[list[File], list[str]]:
    """The files that were not there before the run, within the output bounds, and the paths
    of those left out."""
    outputs: list[File] = []
    left_out: list[str] = []
    total = 0
    for path, size in sorted((await _scan(session)).items()):
        if path in before:
            continue
        if (
            size > MAX_OUTPUT_FILE_BYTES
            or len(outputs) >= MAX_OUTPUT_FILES
            or total + size > MAX_OUTPUT_TOTAL_BYTES
        ):
            left_out.append(path)
            continue
        data = await session.read_file(path)
        assert data is not None
        total += len(data)
        mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
        outputs.append(File(name=path, content=data, mime_type=mime))
    return outputs, left_out


def _is_cache_dir(name: str) -> bool:
    return name.startswith(".") or name == "__pycache__"


def _file_bytes(content: str | bytes) -> bytes:
    """ADK's File.content is raw bytes or base64 text."""
    if isinstance(content, bytes):
        return content
    return base64.b64decode(content)


def _close_quietly(pool: SessionPool) -> None:
    try:
        pool.close()
    except Exception:
        pass
