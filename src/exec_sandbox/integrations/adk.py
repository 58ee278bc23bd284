"""Google ADK: `ExecSandboxCodeExecutor` runs an agent's code blocks in exec-sandbox VMs.

ADK calls `execute_code` synchronously, possibly from inside its running event loop; the work
is sent to the shared background scheduler's own loop thread, so the caller's loop is never
re-entered (no deadlock). With `stateful=True`, one VM per `execution_id` keeps variables between
calls; otherwise each call gets a fresh VM. `input_files` are written into the guest home before
the code runs, each only when the VM does not already hold that content (ADK resends them all on
every call); files the run creates or changes in the home or its subdirectories come back as
`output_files` (named by their path under the home; bounded, see `_changed_files`), and so do
the figures and other rich outputs the code showed (`_rich_outputs`); stderr is
reported only when the code failed (ADK counts any stderr as an error and retries).
"""

from __future__ import annotations

import base64
import hashlib
import json
import mimetypes
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from google.adk.code_executors.base_code_executor import BaseCodeExecutor
from google.adk.code_executors.code_execution_utils import (
    CodeExecutionInput,
    CodeExecutionResult,
    File,
)
from pydantic import ConfigDict, PrivateAttr

from exec_sandbox import Output, SandboxError, SandboxScheduler, Secret

from ._bridge import Runner, _running_loop, before_close
from ._common import SessionPool

if TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext

    from exec_sandbox import SandboxSession

# ADK keeps output files in memory as artifacts: bounded per file, in number and in total. A
# file left out is named in a note appended to stdout, so the model knows it exists.
MAX_OUTPUT_FILE_BYTES = 32 * 1024 * 1024
MAX_OUTPUT_FILES = 64
MAX_OUTPUT_TOTAL_BYTES = 64 * 1024 * 1024
# The search for new and changed files (one guest round trip before the run and one after) is
# bounded in directories, depth and files; dot-directories and __pycache__ (tool caches, not
# results) are not entered.
MAX_SCANNED_DIRS = 256
MAX_SCAN_DEPTH = 8
MAX_SCANNED_FILES = 4096
# An input file written to a session: the digest of the content written, and the file's
# (size, mtime_ns) in the VM right after.
_Written = tuple[str, tuple[int, int] | None]


class ExecSandboxCodeExecutor(BaseCodeExecutor):
    """A BaseCodeExecutor backed by exec-sandbox microVMs (Python code)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scheduler: SandboxScheduler | None = None
    timeout_seconds: int | None = None
    # Python packages installed in the VM (name==version), e.g. ["pandas==2.2.3"].
    packages: list[str] | None = None
    # stateful executors: close() pauses each execution id's session to disk, and the same id
    # resumes it later, also in a new process (an agent's thread gets its variables and files
    # back after a restart).
    persist_sessions: bool = False
    # Network by name (Scheduler.session): off by default; allowed_domains None = any public name.
    allow_network: bool = False
    allowed_domains: list[str] | None = None
    # Secrets the code uses without seeing them, header rules (Scheduler.session).
    secrets: list[Secret] | None = None
    http_headers: dict[str, dict[str, str]] | None = None
    _pool: SessionPool = PrivateAttr()
    # Per session id: the input files written to it (_run), so unchanged ones are not resent.
    _written: dict[str, dict[str, _Written]] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if self.optimize_data_file:
            # ADK would run its pandas data-file exploration code in the VM, which has no pandas
            # unless the caller installs it, and would inline the files into the prompt: refused
            # here, as ADK's own sandbox executors refuse it, rather than failing mid-run.
            raise ValueError(
                "ExecSandboxCodeExecutor does not support optimize_data_file=True; pass the "
                "files as input_files (they are written into /home/user) and let the model's "
                "code read them"
            )
        if self.scheduler is not None and _running_loop() is None:
            # ADK calls execute_code from a worker thread and waits for it; the executor can only
            # hand the work to a scheduler whose loop it knows, the one running when it is made.
            # Without one every call would fail later, deep inside the agent's run.
            raise ValueError(
                "ExecSandboxCodeExecutor(scheduler=...) was made while no event loop is running, "
                "so it cannot know the loop that scheduler runs on, and ADK's synchronous "
                "execute_code could never reach it. Make the executor inside a coroutine on the "
                "loop that runs the scheduler and the agent (e.g. in `async def main()`), or "
                "pass scheduler=None to use the shared background scheduler"
            )
        self._pool = SessionPool(
            Runner(self.scheduler),
            language="python",
            timeout_seconds=self.timeout_seconds,
            packages=self.packages,
            persist="adk" if self.persist_sessions else None,
            allow_network=self.allow_network,
            allowed_domains=self.allowed_domains,
            secrets=self.secrets,
            http_headers=self.http_headers,
        )
        ending = weakref.finalize(self, _close_quietly, self._pool)
        if self.persist_sessions and self.scheduler is None:
            before_close(ending)  # at exit too: paused before the shared scheduler closes

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
                result = await _run(session, request, self._written_to(session))
                if note:  # ADK shows the model stdout: the note goes first
                    result.stdout = f"{note}\n{result.stdout}"
                return result
            finally:
                if key is None:
                    await session.close()
        except SandboxError as exc:
            return CodeExecutionResult(stderr=f"{type(exc).__name__}: {exc}", exit_code=None)

    def _written_to(self, session: SandboxSession) -> dict[str, _Written]:
        live = {s.session_id for s in self._pool.sessions()}
        for gone in [i for i in self._written if i not in live]:
            del self._written[gone]  # sessions that ended: their files are gone with them
        return self._written.setdefault(session.session_id, {})

    def close(self, execution_id: str | None = None) -> None:
        """Destroy the VM of one execution id, or all of them (with persist_sessions: pause them
        to disk instead, to be resumed by the next call with that id)."""
        self._pool.close(execution_id)

    async def aclose(self, execution_id: str | None = None) -> None:
        """close() for async code: it does not block the caller's loop."""
        await self._pool.aclose(execution_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _run(
    session: SandboxSession, request: CodeExecutionInput, written: dict[str, _Written]
) -> CodeExecutionResult:
    """Write the input files the VM does not already hold, run the code, and return the files
    it created or changed. `written`: per input file name, the digest last written and the file's
    (size, mtime) right after, for this session."""
    before = await _scan(session)
    fresh = []
    for file in request.input_files:
        data = _file_bytes(file.content)
        digest = hashlib.sha256(data).hexdigest()
        record = written.get(file.name)
        # ADK passes every input file on every call: rewrite one only when it is new, its
        # content changed, or the code changed or removed the VM's copy since it was written.
        if record is not None and record == (digest, before.get(file.name)):
            continue
        await session.write_file(file.name, data)
        fresh.append((file.name, digest))
    if fresh:
        before = await _scan(session)
        for name, digest in fresh:
            written[name] = (digest, before.get(name))
    result = await session.exec(request.code)
    outputs, left_out = await _changed_files(session, before, await _scan(session))
    shown, text = _rich_outputs(result.outputs, session.exec_count)
    outputs.extend(shown)
    stdout = result.stdout + text
    if left_out:
        stdout += (
            f"\n[exec-sandbox: {len(left_out)} new or changed file(s) not returned (limits: "
            f"{MAX_OUTPUT_FILES} files, {MAX_OUTPUT_FILE_BYTES >> 20} MiB each, "
            f"{MAX_OUTPUT_TOTAL_BYTES >> 20} MiB in all): {', '.join(left_out[:10])}]\n"
        )
    return CodeExecutionResult(
        stdout=stdout,
        stderr=result.stderr if result.exit_code != 0 else "",
        output_files=outputs,
        exit_code=result.exit_code,
    )


# Lists the home in one round trip: run in the session's interpreter in a namespace of its own
# (the user's variables are neither read nor changed). Prints one marked JSON line: path ->
# [size, mtime_ns] for regular files, within the scan bounds.
_SCAN_MARK = "@@exec-sandbox-scan@@ "
_SCAN_SOURCE = f"""
import json, os, sys
root = "/home/user"
found, pending, scanned = {{}}, [("", 0)], 0
while pending and scanned < {MAX_SCANNED_DIRS} and len(found) < {MAX_SCANNED_FILES}:
    rel, depth = pending.pop(0)
    scanned += 1
    try:
        entries = sorted(os.scandir(os.path.join(root, rel)), key=lambda e: e.name)
    except OSError:
        continue
    for entry in entries:
        path = rel + "/" + entry.name if rel else entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                if depth < {MAX_SCAN_DEPTH} and not (
                    entry.name.startswith(".") or entry.name == "__pycache__"
                ):
                    pending.append((path, depth + 1))
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                found[path] = [st.st_size, st.st_mtime_ns]
        except OSError:
            pass
sys.stdout.write("\\n" + {_SCAN_MARK!r} + json.dumps(found) + "\\n")
sys.stdout.flush()
"""
_SCAN_CODE = f"exec({_SCAN_SOURCE!r}, {{'__name__': '__exec_sandbox_scan__'}})"


async def _scan(session: SandboxSession) -> dict[str, tuple[int, int]]:
    """Files under the home, path -> (size, mtime_ns), breadth first within the scan bounds.
    The guest's answer is untrusted: anything malformed is left out."""
    result = await session.exec(_SCAN_CODE)
    line = next((x for x in reversed(result.stdout.splitlines()) if x.startswith(_SCAN_MARK)), None)
    if line is None:
        return {}
    try:
        raw = json.loads(line[len(_SCAN_MARK) :])
    except ValueError:
        return {}
    found: dict[str, tuple[int, int]] = {}
    if not isinstance(raw, dict):
        return found
    for path, stat in list(raw.items())[:MAX_SCANNED_FILES]:
        if (
            isinstance(path, str)
            and _is_home_path(path)
            and isinstance(stat, list)
            and len(stat) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in stat)
        ):
            found[path] = (stat[0], stat[1])
    return found


def _is_home_path(path: str) -> bool:
    parts = path.split("/")
    return (
        0 < len(path) <= 4096
        and "\x00" not in path
        and all(p not in ("", ".", "..") for p in parts)
    )


async def _changed_files(
    session: SandboxSession,
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
) -> tuple[list[File], list[str]]:
    """The files the run created or changed (size or mtime differ), within the output bounds,
    and the paths of those left out."""
    outputs: list[File] = []
    left_out: list[str] = []
    total = 0
    for path, (size, _) in sorted(after.items()):
        if before.get(path) == after[path]:
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


def _rich_outputs(results: list[Output], exec_count: int) -> tuple[list[File], str]:
    """A run's rich outputs as ADK carries them: text/plain values (a cell's last expression,
    display()ed text) appended to stdout, which the model reads; figures, HTML and every other
    type as output files (as ADK's own Vertex executor returns images), named
    `output-<exec>-<n>.<ext>` so that no call's file replaces another's."""
    files: list[File] = []
    lines: list[str] = []
    for n, output in enumerate(results, 1):
        if output.mime_type == "text/plain" and isinstance(output.data, str):
            lines.append(output.data)
            continue
        ext = mimetypes.guess_extension(output.mime_type) or ".bin"
        data = output.data.encode() if isinstance(output.data, str) else output.data
        files.append(
            File(name=f"output-{exec_count}-{n}{ext}", content=data, mime_type=output.mime_type)
        )
    text = "".join(line + "\n" for line in lines)
    return files, text


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
