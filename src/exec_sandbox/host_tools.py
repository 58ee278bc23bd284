"""Host tools: the callables a caller hands to `run()`/`session()` (`tools={"name": fn}`), which
code in the VM calls as `tools.name(...)`.

The guest sends a call's name and its arguments as JSON text (docs/protocol.md, "Host tools and
rich outputs"); this module is the one place that turns that into a call of the caller's
function and its result back into JSON. Nothing else of the guest's is evaluated: the name
picks one of the callables the caller registered, and the arguments are plain JSON values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import json
import keyword
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from .errors import InputValidationError
from .models import ToolCall
from .vm.binding import PROTOCOL_LIMITS

ToolFunction = Callable[..., Any]
log = logging.getLogger("exec_sandbox")

# The protocol's limits (src/shared/protocol.h): what one call may carry each way.
TOOL_NAME_MAX = PROTOCOL_LIMITS["TOOL_NAME_MAX"]
TOOL_ARGS_MAX = PROTOCOL_LIMITS["TOOL_ARGS_MAX"]
TOOL_RESULT_MAX = PROTOCOL_LIMITS["TOOL_RESULT_MAX"]
TOOL_CALLS_MAX = PROTOCOL_LIMITS["TOOL_CALLS_MAX"]  # in flight per execution
TOOL_OK = PROTOCOL_LIMITS["TOOL_OK"]  # enum sbx_tool_status
TOOL_ERROR = PROTOCOL_LIMITS["TOOL_ERROR"]
# How many callables one sandbox may have (their names are listed in errors the guest sees).
TOOLS_MAX = 256

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class HostTools:
    """The validated tools of one run or session. `call()` runs one call from the guest."""

    def __init__(self, tools: Mapping[str, ToolFunction]) -> None:
        if not isinstance(tools, Mapping):
            raise InputValidationError(
                f"tools must be a mapping of names to callables, not {type(tools).__name__}"
            )
        if len(tools) > TOOLS_MAX:
            raise InputValidationError(f"at most {TOOLS_MAX} tools, got {len(tools)}")
        for name, fn in tools.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > TOOL_NAME_MAX:
                raise InputValidationError(
                    f"tool name {name!r} is not an identifier of 1..{TOOL_NAME_MAX} ASCII "
                    "letters, digits and underscores (code calls it as tools.<name>)"
                )
            if name.startswith("_"):
                raise InputValidationError(f"tool name {name!r} may not start with '_'")
            if keyword.iskeyword(name):
                raise InputValidationError(
                    f"tool name {name!r} is a Python keyword: code could not call tools.{name}"
                )
            if not callable(fn):
                raise InputValidationError(f"tool {name!r} is not callable")
        self._tools = dict(tools)

    @classmethod
    def of(cls, tools: Mapping[str, ToolFunction] | None) -> HostTools | None:
        """The tools of a call's options (None when it has none)."""
        return None if tools is None else cls(tools)

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)

    async def call(self, name: str, arguments: bytes) -> tuple[int, bytes, ToolCall]:
        """Run the call the guest asked for: (status, body, the call's log entry). Never raises
        but for cancellation: what goes wrong is the body of a TOOL_ERROR, which the guest
        raises in the code as ToolError."""
        started = time.monotonic()
        text = arguments.decode("utf-8", errors="replace")
        try:
            result = await self._invoke(name, arguments)
            try:
                body = json.dumps(
                    result, ensure_ascii=False, allow_nan=False, default=_as_json
                ).encode()
            except (TypeError, ValueError) as exc:
                log.warning("host tool %r returned a value that is not JSON: %s", name, exc)
                raise _ToolRefusal(
                    f"tool {name!r} returned a value that is not JSON ({exc}): the host "
                    "function must return JSON values, dataclasses or pydantic models"
                ) from None
            if len(body) > TOOL_RESULT_MAX:
                raise _ToolRefusal(
                    f"the result of tool {name!r} is {len(body)} bytes of JSON, over the "
                    f"{TOOL_RESULT_MAX}-byte limit"
                )
            status, error = TOOL_OK, None
        except asyncio.CancelledError:
            raise
        except _ToolRefusal as exc:
            status, body, error = TOOL_ERROR, str(exc).encode(), str(exc)
        except Exception as exc:  # the caller's function: any failure goes to the guest
            error = f"{type(exc).__name__}: {exc}"
            status, body = TOOL_ERROR, error.encode()[:TOOL_RESULT_MAX]
        record = ToolCall(
            name=name,
            arguments=text,
            ok=status == TOOL_OK,
            error=error,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        return status, body, record

    async def _invoke(self, name: str, arguments: bytes) -> Any:
        fn = self._tools.get(name)
        if fn is None:
            listed = ", ".join(self.names) or "none"
            raise _ToolRefusal(f"no tool named {name!r} (tools: {listed})")
        args, kwargs = _parse_arguments(arguments)
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
        ):
            return await fn(*args, **kwargs)
        # A blocking function must not stall the loop (every other VM's I/O runs on it). When
        # the execution ends first, the call is abandoned, not awaited: a thread cannot be
        # stopped, and a tool that hangs must not hold the sandbox's result.
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(_tool_threads(), lambda: fn(*args, **kwargs))
        if inspect.isawaitable(result):
            return await result
        return result


@functools.cache
def _tool_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads sync tools run in: their own, not the loop's default executor, whose few
    threads (cores + 4) the scheduler needs for its own blocking work (cgroup reads, stores):
    slow tools (a web search, an API call) of many sandboxes must not queue that work. As many
    as calls one execution may have in flight, twice."""
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=2 * TOOL_CALLS_MAX, thread_name_prefix="exec-sandbox-tool"
    )


def _as_json(value: object) -> Any:
    """What json.dumps cannot encode by itself but a tool commonly returns, at any depth: a
    dataclass as its fields, a pydantic model as its JSON form. Anything else stays an error:
    guessing (str() of an object) would hand the code a value it cannot use."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _ToolRefusal(Exception):
    """A call the host refuses before or after the function runs: the message is the whole
    error the guest sees (no exception type in front)."""


def _parse_arguments(arguments: bytes) -> tuple[list[Any], dict[str, Any]]:
    if len(arguments) > TOOL_ARGS_MAX:  # the decoder checked already; a second wall is cheap
        raise _ToolRefusal("the call's arguments are over 60 KiB")
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        raise _ToolRefusal(f"the call's arguments are not JSON: {exc}") from None
    if not isinstance(value, dict) or set(value) - {"args", "kwargs"}:
        raise _ToolRefusal('the call\'s arguments must be {"args": [...], "kwargs": {...}}')
    args = value.get("args", [])
    kwargs = value.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise _ToolRefusal('the call\'s arguments must be {"args": [...], "kwargs": {...}}')
    return args, kwargs
