"""LangChain tools: `ExecSandboxTool` runs each call in a fresh VM; `ExecSandboxSessionTool`
keeps one VM per conversation (the `thread_id` of the run's config), so variables persist between
the calls of one thread.

Both return `(content, artifact)` (`response_format="content_and_artifact"`): the model reads the
text (with a python cell's value and display()ed text), followed by image content blocks for the
figures the code showed; the artifact carries exit code, stdout, stderr, timing, every rich
output and the host tool calls. A non-zero exit is ordinary
output; bad arguments and infrastructure failures become `ToolException`, which
`handle_tool_error=True` turns into a message the model can read.
"""

from __future__ import annotations

import weakref
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from exec_sandbox import ExecutionResult, SandboxError, SandboxScheduler, Secret

from ._bridge import Runner
from ._common import (
    LANGUAGES,
    LanguageName,
    NetworkOptions,
    SessionPool,
    network_options,
    result_artifact,
    result_text,
)
from ._outputs import image_blocks


class ExecSandboxInput(BaseModel):
    code: str = Field(description="The source code to run.")
    # A Literal, so the args schema carries the allowed values as an enum: the model is shown
    # them, and a wrong one is refused by the framework's own validation before the tool runs.
    language: LanguageName = Field(
        default="python",
        description="python, javascript, typescript (or ts: runs as JavaScript with its types "
        "stripped; JavaScript code may have type annotations too), or raw (a bash script).",
    )
    packages: list[str] = Field(
        default_factory=list,
        description="Third-party packages to install first: name==version for python "
        "(e.g. pandas==2.2.3), name@version for javascript (e.g. lodash@4.17.21).",
    )


class _SandboxToolBase(BaseTool):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    args_schema: type[BaseModel] = ExecSandboxInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: bool = True
    scheduler: SandboxScheduler | None = None
    timeout_seconds: int | None = None
    # Network by name (Scheduler.run): off by default; allowed_domains None = any public name.
    allow_network: bool = False
    allowed_domains: list[str] | None = None
    # Secrets the code uses without seeing them, header rules (Scheduler.run; docs/design.md).
    secrets: list[Secret] | None = None
    http_headers: dict[str, dict[str, str]] | None = None
    _runner: Runner = PrivateAttr()
    _network: NetworkOptions = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._runner = Runner(self.scheduler)
        self._network = network_options(
            self.allow_network, self.allowed_domains, self.secrets, self.http_headers
        )


def _checked_language(language: str) -> str:
    if language not in LANGUAGES:
        raise ToolException(f"unknown language {language!r}: use one of {', '.join(LANGUAGES)}")
    return language


ToolContent = str | list[str | dict[str, Any]]


def _as_tool_output(result: ExecutionResult, note: str = "") -> tuple[ToolContent, dict[str, Any]]:
    """(content, artifact): the text, and the figures the code showed as image content blocks
    after it (a model that reads images sees the chart; E2B's data-analysis tool does the same)."""
    artifact = result_artifact(result)
    if note:
        artifact["sandbox_note"] = note
    text = result_text(result, note)
    images = image_blocks(result.outputs)
    if not images:
        return text, artifact
    return [{"type": "text", "text": text}, *images], artifact


class ExecSandboxTool(_SandboxToolBase):
    """Runs code in a fresh, disposable microVM per call (nothing persists between calls)."""

    name: str = "exec_sandbox"
    description: str = (
        "Run code in an isolated sandbox VM and get its output. Each call starts from a clean "
        "machine. Arguments: code, language (python, javascript, typescript or raw for bash), "
        "packages "
        "(optional, pinned: pandas==2.2.3 for python, lodash@4.17.21 for javascript)."
    )

    def _run(
        self,
        code: str,
        language: LanguageName = "python",
        packages: list[str] | None = None,
        run_manager: CallbackManagerForToolRun | None = None,
    ) -> tuple[ToolContent, dict[str, Any]]:
        try:
            result = self._runner.run(
                lambda s: s.run(
                    code,
                    language=language,
                    timeout_seconds=self.timeout_seconds,
                    packages=packages,
                    **self._network,
                )
            )
        except SandboxError as exc:
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        return _as_tool_output(result)

    async def _arun(
        self,
        code: str,
        language: LanguageName = "python",
        packages: list[str] | None = None,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
    ) -> tuple[ToolContent, dict[str, Any]]:
        try:
            result = await self._runner.arun(
                lambda s: s.run(
                    code,
                    language=language,
                    timeout_seconds=self.timeout_seconds,
                    packages=packages,
                    **self._network,
                )
            )
        except SandboxError as exc:
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        return _as_tool_output(result)


class ExecSandboxSessionInput(BaseModel):
    # Extra fields refused: a model that sends "language" must learn that the session's is
    # fixed, not have its javascript run as python.
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="The source code to run in the persistent interpreter.")


class ExecSandboxSessionTool(_SandboxToolBase):
    """Keeps one sandbox VM per conversation thread (`config["configurable"]["thread_id"]`):
    variables, imports, files and the working directory persist between calls of that thread.
    Call `close()` / `aclose()` when done; sessions idle longer than the scheduler's
    `session_idle_timeout_seconds` close themselves, and the shared scheduler closes at exit."""

    name: str = "exec_sandbox_session"
    description: str = (
        "Run code in a persistent sandboxed interpreter: variables and files from earlier calls "
        "in this conversation are still there."
    )
    args_schema: type[BaseModel] = ExecSandboxSessionInput
    language: str = "python"
    # Installed in every thread's VM when it opens (name==version / name@version).
    packages: list[str] | None = None
    _pool: SessionPool = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        _checked_language(self.language)
        if "description" not in self.model_fields_set:
            # The model sees only `code`: the description is where it learns the language.
            self.description = _session_description(self.language, self.packages)
        self._pool = SessionPool(
            self._runner,
            language=self.language,
            timeout_seconds=self.timeout_seconds,
            packages=self.packages,
            **self._network,
        )
        # An abandoned tool must not keep its VMs until the idle timeout.
        weakref.finalize(self, _close_quietly, self._pool)

    @property
    def thread_ids(self) -> list[str]:
        """Threads that currently hold a live VM."""
        return self._pool.keys()

    def _run(
        self,
        code: str,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
    ) -> tuple[ToolContent, dict[str, Any]]:
        key = _thread_id(config)
        try:
            result, note = self._pool.runner.run(lambda s: self._exec(s, key, code))
        except SandboxError as exc:
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        return _as_tool_output(result, note)

    async def _arun(
        self,
        code: str,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
    ) -> tuple[ToolContent, dict[str, Any]]:
        key = _thread_id(config)
        try:
            result, note = await self._pool.runner.arun(lambda s: self._exec(s, key, code))
        except SandboxError as exc:
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        return _as_tool_output(result, note)

    async def _exec(
        self, scheduler: SandboxScheduler, key: str | None, code: str
    ) -> tuple[ExecutionResult, str]:
        return await self._pool.exec(scheduler, key, code, missing="thread_id in the run's config")

    def close(self, thread_id: str | None = None) -> None:
        """Destroy one thread's VM, or all of them."""
        self._pool.close(thread_id)

    async def aclose(self, thread_id: str | None = None) -> None:
        await self._pool.aclose(thread_id)


_LANGUAGE_NAMES = {
    "python": "Python",
    "javascript": "JavaScript (Node.js; type annotations are accepted)",
    "typescript": "TypeScript (Node.js, types stripped, not checked)",
    "ts": "TypeScript (Node.js, types stripped, not checked)",
    "raw": "bash",
}


def _session_description(language: str, packages: list[str] | None) -> str:
    text = (
        f"Run {_LANGUAGE_NAMES[language]} code in a persistent sandboxed interpreter: variables "
        "and files from earlier calls in this conversation are still there."
    )
    if packages:
        text += f" Installed packages: {', '.join(packages)}."
    return text


def _thread_id(config: RunnableConfig | None) -> str | None:
    """The conversation's key, or None: a call without a thread id runs in a VM of its own
    (LangGraph keeps no state across runs without one either), never in one shared by every
    caller that gave none."""
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return None if thread is None or thread == "" else str(thread)


def _close_quietly(pool: SessionPool) -> None:
    try:
        pool.close()
    except Exception:
        pass
