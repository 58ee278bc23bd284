"""Deep Agents backend: `ExecSandboxBackend` is a `deepagents` `BaseSandbox` whose shell commands
and files live in one exec-sandbox VM (a bash session). BaseSandbox builds ls/read/write/edit/
grep/glob on top of `execute`, `upload_files` and `download_files`, implemented here.

Contract (deepagents.backends.protocol): execute returns stdout and stderr combined, in arrival
order; a timeout gives exit code 124 (like coreutils `timeout`); output beyond `max_output_bytes`
is cut and flagged `truncated=True`. File transfers take absolute paths, report one result per
path in input order, never raise, create missing parent directories and are binary-safe.

glob and write follow deepagents' BaseSandbox (`file_contract="deepagents"`, the default): glob
returns absolute paths of files, which deepagents' permission `deny` rules and CompositeBackend
route prefixes rely on; write creates or overwrites. `file_contract="standard"` follows
langchain's standard sandbox suite (langchain-tests 1.1.9) where it disagrees: glob paths relative
to the search root, directories included; write refuses a file that exists. docs/integrations.md
says more.

A per-command timeout passes through as deepagents gives it (0: no limit); one above our hard
limit (MAX_TIMEOUT_SECONDS, a day) runs with that limit, and the output says so. File transfers
are batched (_sandbox_files.py): a few guest round trips per call, not per file.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import shlex
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    GlobResult,
    WriteResult,
)
from deepagents.backends.sandbox import BaseSandbox

from exec_sandbox import OutputLimitError, SandboxError, SandboxScheduler, Secret
from exec_sandbox.limits import MAX_TIMEOUT_SECONDS

from ._bridge import Runner, before_close
from ._common import SavedSessions, ended_note, network_options
from ._sandbox_files import (
    download_command,
    parse_download_report,
    parse_upload_report,
    path_batches,
    upload_batches,
    upload_blob,
    upload_command,
)
from ._sandbox_glob import glob_command, parse_glob_output, search_root

if TYPE_CHECKING:
    from exec_sandbox import SandboxSession

TIMEOUT_EXIT_CODE = 124
FileContract = Literal["standard", "deepagents"]
# The guest script stops itself after its walk budget; this only catches a wedged interpreter.
_GLOB_TIMEOUT_SECONDS = 30
# A workspace VM: the guest sizes /tmp (25%) and the home (40%) from its RAM, and agents move
# files of tens of MiB around (the standard suite uploads 10 MiB files), so more than run()'s.
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
# Transfers go through the guest home (the only place the file API writes) and are moved from
# there with the shell, which also gives the errors a model can act on.
_STAGING = ".exec-sandbox-transfer"
# Where the `python` command is provided when the image only has python3.
_SHIM_BIN = ".local/exec-sandbox-bin"
_PREAMBLE = (
    f'case ":$PATH:" in *":$HOME/{_SHIM_BIN}:"*) ;; '
    f'*) export PATH="$HOME/{_SHIM_BIN}:$PATH";; esac\n'
)
_SETUP = (
    f"mkdir -p ~/{_STAGING} ~/{_SHIM_BIN} && "
    f'{{ command -v python >/dev/null || ln -sf "$(command -v python3)" ~/{_SHIM_BIN}/python; }}'
)


class ExecSandboxBackend(BaseSandbox):
    """A Deep Agents sandbox backed by one exec-sandbox VM, started on first use.

    `scheduler=None` uses the shared background scheduler. Call `close()` (or `aclose()`) to
    destroy the VM; an abandoned backend is closed when garbage-collected, an idle one after the
    scheduler's `session_idle_timeout_seconds`, and the shared scheduler kills what is left at
    exit. A closed backend opens a fresh VM on its next call.

    `file_contract="deepagents"` (default): BaseSandbox's own glob (absolute file paths) and
    write (creates or overwrites); `"standard"`: glob and write as langchain-tests pins them
    (relative glob paths with directories, write refuses an existing file).

    With a `session_key`, close() pauses the VM to disk and a later backend with the same key
    resumes it; a keyed backend dropped without close() is paused the same way when it is
    garbage-collected.
    """

    def __init__(
        self,
        scheduler: SandboxScheduler | None = None,
        *,
        timeout_seconds: int = 120,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        memory_mb: int = DEFAULT_MEMORY_MB,
        file_contract: FileContract = "deepagents",
        packages: Sequence[str] | None = None,
        session_key: str | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        secrets: Sequence[Secret] | None = None,
        http_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        if file_contract not in ("standard", "deepagents"):
            raise ValueError(
                f"file_contract must be 'standard' or 'deepagents', not {file_contract!r}"
            )
        if not (timeout_seconds == 0 or 1 <= timeout_seconds <= MAX_TIMEOUT_SECONDS):
            raise ValueError(
                f"timeout_seconds must be between 1 and {MAX_TIMEOUT_SECONDS}, or 0 for no "
                f"limit, not {timeout_seconds}"
            )
        self._contract = file_contract
        self._runner = Runner(scheduler)
        self._memory_mb = memory_mb
        # Python packages (name==version) for the python3 that the agent's commands run.
        self._packages = list(packages) if packages else None
        # Network by name for the agent's commands (checked now, before any VM).
        self._network = network_options(allow_network, allowed_domains, secrets, http_headers)
        # With a key (e.g. the agent's thread id), close() pauses the VM to disk and a backend
        # made later with the same key, also in a new process, resumes it: files, cwd and env.
        self._saved = SavedSessions("deepagents") if session_key else None
        self._key = session_key or ""
        self._timeout = timeout_seconds
        self._max_output = max_output_bytes
        self._id = f"exec-sandbox-{uuid.uuid4().hex[:12]}"
        self._holder: list[SandboxSession] = []
        # Owed to the model's next execute() when the session ended behind its back (ended_note).
        self._note = ""
        # Concurrent first calls (deepagents runs tools in parallel) must share one session: without
        # it each would open its own and all but the last would leak until their idle timeout.
        self._opening = asyncio.Lock()
        # Dropped without close(): a keyed backend's VM is paused (its key resumes it later), as
        # close() would; an unkeyed one is destroyed.
        ending = weakref.finalize(
            self, _end_quietly, self._runner, self._holder, self._saved, self._key
        )
        if self._saved is not None and scheduler is None:
            before_close(ending)  # at exit too: paused before the shared scheduler closes

    @property
    def id(self) -> str:
        return self._id

    # --- execute ---

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        # Read here, in the caller's context: the work runs on another loop's thread.
        for_model = not _IN_FILE_OP.get()
        return self._runner.run(lambda s: self._execute(s, command, timeout, for_model))

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        for_model = not _IN_FILE_OP.get()
        return await self._runner.arun(lambda s: self._execute(s, command, timeout, for_model))

    async def _execute(
        self, scheduler: SandboxScheduler, command: str, timeout: int | None, for_model: bool
    ) -> ExecuteResponse:
        if not command.strip():
            return ExecuteResponse(output="Error: the command is empty", exit_code=2)
        seconds, note = _command_timeout(self._timeout, timeout)
        chunks: list[str] = []
        size = 0
        truncated = False

        def collect(text: str) -> None:
            nonlocal size, truncated
            if size >= self._max_output:
                truncated = True
                return
            room = self._max_output - size
            if len(text) > room:
                text, truncated = text[:room], True
            chunks.append(text)
            size += len(text)

        try:
            session = await self._session(scheduler)
            result = await session.exec(
                _PREAMBLE + command, timeout_seconds=seconds, on_stdout=collect, on_stderr=collect
            )
        except OutputLimitError as exc:
            return ExecuteResponse(
                output="".join(chunks) + f"\n[output truncated: {exc}]",
                exit_code=None,
                truncated=True,
            )
        except SandboxError as exc:
            return ExecuteResponse(output=f"Error: {type(exc).__name__}: {exc}", exit_code=None)
        output = "".join(chunks) + note
        if for_model and self._note:
            # Before the output, where BaseSandbox's own parsers never see it.
            output, self._note = f"{self._note}\n{output}", ""
        if result.exit_code == -1:
            output += (
                f"\nError: the command timed out after {seconds} seconds; the shell was reset, "
                "so its working directory and environment variables are back to their defaults"
            )
            return ExecuteResponse(output=output, exit_code=TIMEOUT_EXIT_CODE, truncated=truncated)
        return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=truncated)

    # --- files ---

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self._runner.run(lambda s: self._upload(s, files))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await self._runner.arun(lambda s: self._upload(s, files))

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self._runner.run(lambda s: self._download(s, paths))

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await self._runner.arun(lambda s: self._download(s, paths))

    async def _upload(
        self, scheduler: SandboxScheduler, files: list[tuple[str, bytes]]
    ) -> list[FileUploadResponse]:
        errors: list[str | None] = [None] * len(files)
        valid = []
        for index, (path, content) in enumerate(files):
            if _is_absolute(path):
                valid.append((index, path, bytes(content)))
            else:
                errors[index] = "invalid_path"
        for batch in upload_batches(valid):
            for (index, _, _), error in zip(
                batch, await self._upload_batch(scheduler, batch), strict=True
            ):
                errors[index] = error
        return [
            FileUploadResponse(path=path, error=error)
            for (path, _), error in zip(files, errors, strict=True)
        ]

    async def _upload_batch(
        self, scheduler: SandboxScheduler, batch: list[tuple[int, str, bytes]]
    ) -> list[str | None]:
        """One file transfer and one command for the whole batch."""
        staged = f"{_STAGING}/{uuid.uuid4().hex}"
        try:
            session = await self._session(scheduler)
            await session.write_file(staged, upload_blob(batch))
            result = await session.exec(upload_command(staged), timeout_seconds=self._timeout)
        except SandboxError as exc:
            return [f"{type(exc).__name__}: {exc}"] * len(batch)
        return parse_upload_report(result.stdout, len(batch))

    async def _download(
        self, scheduler: SandboxScheduler, paths: list[str]
    ) -> list[FileDownloadResponse]:
        found: list[tuple[bytes | None, str | None]] = [(None, "invalid_path")] * len(paths)
        pending = [(index, path) for index, path in enumerate(paths) if _is_absolute(path)]
        while pending:
            deferred: list[tuple[int, str]] = []
            for batch in path_batches(pending):
                done = await self._download_batch(scheduler, [path for _, path in batch])
                for (index, path), entry in zip(batch, done, strict=True):
                    if entry is None:
                        deferred.append((index, path))
                    else:
                        found[index] = entry
            if len(deferred) == len(pending):  # no progress: the guest's report is not honest
                for index, _ in deferred:
                    found[index] = (None, "the sandbox did not return this file")
                break
            pending = deferred
        return [
            FileDownloadResponse(path=path, content=content, error=error)
            for path, (content, error) in zip(paths, found, strict=True)
        ]

    async def _download_batch(
        self, scheduler: SandboxScheduler, paths: list[str]
    ) -> list[tuple[bytes | None, str | None] | None]:
        """One command copies the readable files into one staged blob, one file transfer brings
        it back, one command removes it. None for a path the blob had no room for."""
        staged = f"{_STAGING}/{uuid.uuid4().hex}"
        try:
            session = await self._session(scheduler)
            result = await session.exec(
                download_command(staged, paths), timeout_seconds=self._timeout
            )
            entries = parse_download_report(result.stdout, len(paths))
            data = await session.read_file(staged) or b""
        except SandboxError as exc:
            return [(None, f"{type(exc).__name__}: {exc}")] * len(paths)
        finally:
            if self._holder and not self._holder[0].closed:
                await _discard(self._holder[0], staged)
        if sum(e for e in entries if isinstance(e, int)) != len(data):
            return [(None, "the sandbox's copy of the files is incomplete")] * len(paths)
        out: list[tuple[bytes | None, str | None] | None] = []
        offset = 0
        for entry in entries:
            if isinstance(entry, int):
                out.append((data[offset : offset + entry], None))
                offset += entry
            else:
                out.append(None if entry is None else (None, entry))
        return out

    # --- glob and write (the BaseSandbox contract, or langchain-tests' with "standard") ---

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        if self._contract == "deepagents":
            return super().glob(pattern, path)
        command = glob_command(pattern, search_root(path))
        if command is None:
            return GlobResult(error="glob needs a non-empty pattern without NUL bytes")
        return parse_glob_output(self.execute(command, timeout=_GLOB_TIMEOUT_SECONDS))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        if self._contract == "deepagents":
            return await super().aglob(pattern, path)
        command = glob_command(pattern, search_root(path))
        if command is None:
            return GlobResult(error="glob needs a non-empty pattern without NUL bytes")
        return parse_glob_output(await self.aexecute(command, timeout=_GLOB_TIMEOUT_SECONDS))

    def write(self, file_path: str, content: str) -> WriteResult:
        if self._contract == "deepagents":
            return super().write(file_path, content)
        return self._runner.run(lambda s: self._write_new(s, file_path, content))

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        if self._contract == "deepagents":
            return await super().awrite(file_path, content)
        return await self._runner.arun(lambda s: self._write_new(s, file_path, content))

    async def _write_new(self, scheduler: SandboxScheduler, path: str, content: str) -> WriteResult:
        """Create `path` (and its parents) with `content`; an existing path is left untouched.
        bash's noclobber opens the target with O_EXCL, so the check and the create are one step."""
        if not _is_absolute(path):
            return WriteResult(error=f"Error: '{path}' is not an absolute path")
        staged = f"{_STAGING}/{uuid.uuid4().hex}"
        quoted = shlex.quote(path)
        try:
            session = await self._session(scheduler)
            await session.write_file(staged, content.encode("utf-8"))
            result = await session.exec(
                f'( set -C; mkdir -p -- "$(dirname -- {quoted})" && cat -- ~/{staged} > {quoted};'
                f" status=$?; rm -f -- ~/{staged}; exit $status )",
                timeout_seconds=self._timeout,
            )
        except SandboxError as exc:
            return WriteResult(error=f"Failed to write file '{path}': {type(exc).__name__}: {exc}")
        if "cannot overwrite existing file" in result.stderr:
            return WriteResult(
                error=f"Error: {path} already exists; change it with edit_file, "
                "or write to a new path"
            )
        if result.exit_code != 0:
            return WriteResult(error=f"Failed to write file '{path}': {_file_error(result.stderr)}")
        return WriteResult(path=path)

    # --- lifecycle ---

    async def _session(self, scheduler: SandboxScheduler) -> SandboxSession:
        async with self._opening:
            if self._holder and not self._holder[0].closed:
                return self._holder[0]
            # close() empties the holder: a closed session still in it ended on its own.
            ended = self._holder[0] if self._holder else None
            if self._saved is not None:
                resumed = await self._saved.resume(scheduler, self._key)
                if resumed is not None:
                    self._holder[:] = [resumed]
                    if ended is not None:
                        self._note = ended_note(ended, resumed=True)
                    return resumed
            if ended is not None:
                self._note = ended_note(ended, resumed=False)
            session = await scheduler.session(
                language="raw",
                timeout_seconds=self._timeout,
                memory_mb=self._memory_mb,
                packages=self._packages,
                _packages_language="python",
                **self._network,
            )
            self._holder[:] = [session]
            setup = await session.exec(_SETUP)
            if setup.exit_code != 0:
                await session.close()
                raise SandboxError(f"preparing the sandbox failed: {setup.stderr.strip()}")
            return session

    def close(self) -> None:
        """Destroy the VM (idempotent); with a session_key, pause it to disk instead."""
        if self._holder:
            self._runner.run(lambda s: self._end(s))

    async def aclose(self) -> None:
        if self._holder:
            await self._runner.arun(lambda s: self._end(s))

    async def _end(self, scheduler: SandboxScheduler) -> None:
        await _end_sessions(scheduler, self._holder, self._saved, self._key)


# Set while one of BaseSandbox's file operations runs: the commands they send through execute()
# have their output parsed, so a note for the model must wait for the model's own execute().
_IN_FILE_OP: contextvars.ContextVar[bool] = contextvars.ContextVar("in_file_op", default=False)
_FILE_OPS = (
    "ls", "als", "read", "aread", "write", "awrite", "edit", "aedit",
    "delete", "adelete", "grep", "agrep", "glob", "aglob",
)  # fmt: skip


def _as_file_op(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_op(*args: Any, **kwargs: Any) -> Any:
            token = _IN_FILE_OP.set(True)
            try:
                return await method(*args, **kwargs)
            finally:
                _IN_FILE_OP.reset(token)

        return async_op

    @functools.wraps(method)
    def op(*args: Any, **kwargs: Any) -> Any:
        token = _IN_FILE_OP.set(True)
        try:
            return method(*args, **kwargs)
        finally:
            _IN_FILE_OP.reset(token)

    return op


for _name in _FILE_OPS:
    setattr(ExecSandboxBackend, _name, _as_file_op(getattr(ExecSandboxBackend, _name)))


def _command_timeout(default: int, asked: int | None) -> tuple[int, str]:
    """The seconds a command runs with (0: no limit, as deepagents means it), and a note for its
    output when that is not what was asked: above our hard limit, MAX_TIMEOUT_SECONDS (a day),
    it runs with the limit, and a model told nothing would take a cut-off run for its own bug."""
    if asked is None or asked < 0:
        return default, ""
    if asked > MAX_TIMEOUT_SECONDS:
        return MAX_TIMEOUT_SECONDS, (
            f"\n[sandbox note: timeout {asked} s is above this sandbox's limit; the command ran "
            f"with the maximum, {MAX_TIMEOUT_SECONDS} s]"
        )
    return asked, ""


def _is_absolute(path: str) -> bool:
    return isinstance(path, str) and path.startswith("/") and "\x00" not in path


def _file_error(stderr: str) -> str:
    lowered = stderr.lower()
    if "permission denied" in lowered or "read-only file system" in lowered:
        return "permission_denied"
    if "is a directory" in lowered:
        return "is_directory"
    if "no such file" in lowered or "not a directory" in lowered:
        return "invalid_path"
    return stderr.strip() or "unknown error"


async def _discard(session: SandboxSession, staged: str) -> None:
    try:
        await session.exec(f"rm -f -- ~/{staged}")
    except SandboxError:
        pass


async def _end_sessions(
    scheduler: SandboxScheduler,
    holder: list[SandboxSession],
    saved: SavedSessions | None,
    key: str,
) -> None:
    """Close the held session, or with a key pause it to disk (closing it if that fails)."""
    while holder:
        session = holder.pop()
        if session.closed:
            continue
        if saved is None:
            await session.close()
            continue
        try:
            await saved.save(scheduler, key, session)
        except SandboxError:
            await session.close()


def _end_quietly(
    runner: Runner, holder: list[SandboxSession], saved: SavedSessions | None, key: str
) -> None:
    if all(session.closed for session in holder):
        return
    try:
        runner.run(lambda s: _end_sessions(s, holder, saved, key))
    except Exception:
        pass
