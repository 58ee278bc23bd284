"""Code mode: the agent's tools, callable from the model's code in the VM under their own names.

CodeAct-style frameworks (langgraph-codeact, LlamaIndex's CodeActAgent) show the model its tools
as plain functions (`def search(query: str): ...`) and promise that top-level variables persist
between code blocks. The tools stay on the host: each becomes a host tool of the sandbox
(`tools={"search": fn}`), which the guest offers as `tools.search(...)`, and a short binding
(`search = tools.search`) makes the names the prompt shows work as written. Sessions bind once,
in an exec of its own so that the model's line numbers stay as it wrote them, and again after a
failed exec (a timeout or a crash of the REPL loses the bindings with the rest of its state).
"""

from __future__ import annotations

import keyword
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from exec_sandbox import ExecutionResult, SandboxScheduler, SandboxSession
from exec_sandbox.host_tools import ToolFunction

from ._common import SessionPool, alone_note, runtime_language

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a host tool's name may be (exec_sandbox.host_tools checks the same).
_NAME_MAX = 64
# Languages whose guest runtime offers `tools`.
_TOOL_LANGUAGES = ("python", "javascript")


def usable_name(name: object, language: str = "python") -> bool:
    """Whether code can call a tool by this name: an identifier the host accepts as a tool name
    (no leading underscore) and, in python, not a keyword."""
    if not isinstance(name, str) or len(name) > _NAME_MAX or name.startswith("_"):
        return False
    if not _IDENTIFIER.fullmatch(name):
        return False
    return not (language == "python" and keyword.iskeyword(name))


def host_function(value: Any) -> ToolFunction | None:
    """The host-side callable for one of an agent's tools, or None when `value` is not one:
    a LangChain BaseTool (called with `ainvoke`, positional arguments mapped to its schema's
    fields in order), a LlamaIndex tool (called with `acall`, its raw output returned), or any
    other function (called as it is, awaited when async). Classes are not tools."""
    if value is None or isinstance(value, type):
        return None
    langchain = sys.modules.get("langchain_core.tools")
    if langchain is not None and isinstance(value, langchain.BaseTool):
        return _langchain_function(value)
    llamaindex = sys.modules.get("llama_index.core.tools")
    if llamaindex is not None and isinstance(value, llamaindex.BaseTool):
        return _llamaindex_function(value)
    return value if callable(value) else None


def _langchain_function(tool: Any) -> ToolFunction:
    fields = list(tool.args)

    async def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(fields):
            raise TypeError(
                f"{tool.name}() takes {len(fields)} positional arguments but {len(args)} were given"
            )
        given = dict(zip(fields, args, strict=False))
        twice = sorted(given.keys() & kwargs.keys())
        if twice:
            raise TypeError(f"{tool.name}() got multiple values for argument {twice[0]!r}")
        # Pydantic models and dataclasses in the result: encoded by HostTools, at any depth.
        return await tool.ainvoke({**given, **kwargs})

    call.__name__ = str(tool.name)
    return call


def _llamaindex_function(tool: Any) -> ToolFunction:
    async def call(*args: Any, **kwargs: Any) -> Any:
        # acall, not the bare function: the tool's partial params and field defaults apply.
        if hasattr(tool, "acall"):
            output = await tool.acall(*args, **kwargs)
        else:
            output = tool.call(*args, **kwargs)
        return output.raw_output

    call.__name__ = str(tool.metadata.get_name())
    return call


def binding_code(language: str, names: Iterable[str]) -> str | None:
    """One line that makes each tool callable by its bare name (`search(...)` for
    `tools.search(...)`), leaving a name the code already defined alone; None when there is
    nothing to bind or the language has no tools. The line ends in a statement that is not an
    expression, so a session shows no value for it."""
    language = runtime_language(language)
    listed = sorted(set(names))
    if not listed or language not in _TOOL_LANGUAGES:
        return None
    if language == "python":
        names_tuple = "(" + "".join(f"{n!r}, " for n in listed) + ")"
        return (
            '__sbx_tools = vars(__import__("builtins")).get("tools"); '
            "__sbx_tools = tools if __sbx_tools is None else __sbx_tools; "
            "globals().update({__n: getattr(__sbx_tools, __n) "
            f"for __n in {names_tuple} if __n not in globals()}}); "
            "del __sbx_tools"
        )
    names_array = "[" + ", ".join(f'"{n}"' for n in listed) + "]"
    return (
        f"for (const __n of {names_array}) "
        "{ if (!(__n in globalThis)) globalThis[__n] = tools[__n]; } void 0;"
    )


def with_binding(language: str, code: str, tools: Mapping[str, ToolFunction]) -> str:
    """Code for a one-shot run: the binding line, then the code (one line further down)."""
    binding = binding_code(language, tools)
    return code if binding is None else f"{binding}\n{code}"


def offered(language: str, tools: Mapping[str, ToolFunction]) -> dict[str, ToolFunction] | None:
    """The tools to give run()/session(): None when there are none or the language cannot call
    them (a bash run), so that a scheduler without host tools (a cluster) is still usable."""
    language = runtime_language(language)
    if not tools or language not in _TOOL_LANGUAGES:
        return None
    return dict(tools)


class ToolSessions:
    """Sessions of a SessionPool whose code calls the agent's tools by name. Remembers which live
    sessions have the names bound; a session is bound before its first code block and again
    after an exec that failed (a reset REPL lost them; the binding skips names still defined)."""

    def __init__(self, pool: SessionPool) -> None:
        self.pool = pool
        self._bound: set[str] = set()

    async def exec(
        self,
        scheduler: SandboxScheduler,
        key: str | None,
        code: str,
        tools: Mapping[str, ToolFunction],
        *,
        missing: str,
    ) -> tuple[ExecutionResult, str]:
        """Run code in the key's session (a session of its own without a key, as
        SessionPool.exec); the result and the notes the model should read with it."""
        language = self.pool.language
        host = offered(language, tools)
        binding = binding_code(language, host or {})
        if key is None:
            session = await self.pool.open(scheduler, tools=host)
            try:
                notes = [alone_note(missing)]
                if binding is not None:
                    notes.append(await _bind(session, binding))
                return await session.exec(code), _join(notes)
            finally:
                await session.close()
        live = {s.session_id for s in self.pool.sessions()}
        self._bound &= live
        session = await self.pool.get(scheduler, key, tools=host)
        notes = [self.pool.take_note(key)]
        if binding is not None and session.session_id not in self._bound:
            note = await _bind(session, binding)
            if not note:
                self._bound.add(session.session_id)
            notes.append(note)
        result = await session.exec(code)
        if result.exit_code != 0:
            self._bound.discard(session.session_id)
        return result, _join(notes)


async def _bind(session: SandboxSession, binding: str) -> str:
    """Run the binding line in the session: "" when it worked, else a note for the model."""
    result = await session.exec(binding)
    if result.exit_code == 0:
        return ""
    reason = (result.stderr.strip().splitlines() or [f"exit code {result.exit_code}"])[-1]
    return (
        f"[sandbox note: the tools could not be bound to their names ({reason}); "
        "call them as tools.<name>(...)]"
    )


def _join(notes: list[str]) -> str:
    return "\n".join(note for note in notes if note)
