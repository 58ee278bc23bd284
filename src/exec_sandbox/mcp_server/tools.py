"""The MCP tools of `sbx mcp`, on the official SDK's MCPServer. Each tool is one call of the public
API (`SandboxScheduler` / `SandboxSession`), so it works the same over a local Scheduler, a
RemoteScheduler (`sbx mcp --server`) or a cluster. Descriptions are written for the model that
reads them: what persists, the limits, the languages, what the sandbox has.

Tool errors (bad input, an unknown or closed session, no capacity) are MCP tool results with
isError set and the library's stable error code first (docs/server.md), so the model reads and
corrects them; a program that fails is a normal result with its exit code.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import Field, ValidationError

from .. import wire
from ..errors import InputValidationError, SandboxError
from ..limits import MAX_TIMEOUT_SECONDS
from ..models import LanguageName
from ..protocols import SandboxSession
from ..run_request import RunOptions
from . import render
from .progress import OutputProgress
from .sessions import Sandboxes, UnknownSession, owner_of

# Bytes read_file returns (larger files: read part of them with exec).
READ_MAX_BYTES = 256 * 1024

INSTRUCTIONS = """\
exec-sandbox runs code in disposable QEMU microVMs (a Linux guest: Debian with Python 3.13 and \
Node.js 22, GNU Bash and coreutils). Nothing of the host is visible inside. Use run_code for a \
one-off program (a fresh VM each call, nothing kept). Use open_session when state should \
persist: variables, imports, files and the working directory stay between exec calls until \
close_session. Files live under /home/user (relative paths resolve there). Packages: pass them \
pinned to run_code or open_session, or install them inside a session with `pip install \
name==version` / `npm install name@version` (served by the host: no network needed). Close \
sessions you no longer need: the server keeps only a few open."""

LanguageArg = Annotated[
    LanguageName,
    Field(
        description="python (3.13), javascript (Node.js 22), typescript (or ts: runs on Node.js, "
        "types stripped) or raw (a GNU Bash script)"
    ),
]
PackagesArg = Annotated[
    list[str] | None,
    Field(
        description="packages installed before the code runs, pinned: python name==version "
        "(e.g. numpy==2.1.3), javascript name@version (e.g. lodash@4.17.21); at most 50",
    ),
]
# 0 ("no limit" in the API) is not offered: a model's call must end.
TimeoutArg = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="seconds before the code is stopped (default: the server's, 30 unless "
        "configured)",
    ),
]
SessionIdArg = Annotated[str, Field(description="the id open_session (or resume_session) gave")]
PathArg = Annotated[
    str,
    Field(description="a path in the VM; relative paths are under /home/user"),
]

_ToolFn = Callable[..., Awaitable[CallToolResult]]


def _sandboxes(ctx: Context[Sandboxes, Any]) -> Sandboxes:
    return ctx.request_context.lifespan_context


def _owner(ctx: Context[Sandboxes, Any]) -> str | None:
    """The client connection a session belongs to: streamable HTTP's MCP session id (issued by
    the server, and refused by the transport when unknown), qualified by the caller `sbx serve`
    authenticated (PRINCIPAL_HEADER, which it sets itself); None over stdio (one client) and
    stateless HTTP (no connection to tell apart)."""
    headers = ctx.headers
    if headers is None:
        return None
    return owner_of(headers.get("mcp-session-id"), headers.get(wire.PRINCIPAL_HEADER))


def _tool_errors(fn: _ToolFn) -> _ToolFn:
    """Library failures and unknown ids as tool errors the model can read; anything else is a
    bug, left to the SDK (logged, a generic tool error)."""

    # wraps(): the SDK builds the input schema from the signature and annotations it copies.
    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> CallToolResult:
        try:
            return await fn(*args, **kwargs)
        except UnknownSession as exc:
            return render.error(f"{wire.NOT_FOUND}: {exc.args[0]}")
        except SandboxError as exc:
            return render.exception(exc)

    return call


async def run_code(
    code: Annotated[str, Field(description="the program (at most 1 MB)")],
    ctx: Context[Sandboxes, Any],
    language: LanguageArg = "python",
    packages: PackagesArg = None,
    timeout_seconds: TimeoutArg = None,
) -> CallToolResult:
    """Run a program in a fresh, isolated VM and return its exit code, stdout, stderr and rich
    outputs; the VM is destroyed afterwards, so nothing (variables, files, installs) carries over
    to the next call: use open_session for that. stdout and stderr are cut in the middle past
    20000 characters (the cut is marked). In python, objects given to display() and matplotlib
    figures are returned too, images as images. A timeout
    gives exit_code -1. No network access unless the server was started with it."""
    sandboxes = _sandboxes(ctx)
    progress = OutputProgress(ctx)
    try:
        result = await sandboxes.scheduler.run(
            code,
            **sandboxes.run_options(
                language=language,
                packages=packages or None,
                timeout_seconds=timeout_seconds,
                on_stdout=progress.callback,
                on_stderr=progress.callback,
            ),
        )
    finally:
        await progress.finish()
    return render.execution(result)


async def open_session(
    ctx: Context[Sandboxes, Any],
    language: LanguageArg = "python",
    packages: PackagesArg = None,
) -> CallToolResult:
    """Start a persistent session: one VM with a live interpreter (a REPL) of the language. Its
    id is what exec, write_file, read_file, list_files, pause_session and close_session take.
    Variables, imports, functions, files, the working directory and environment persist between
    exec calls. A timeout resets the interpreter (its state is lost, the session stays); a
    session unused for a while (5 minutes by default) is closed by the server. Close it with
    close_session when done: only a few may be open at once."""
    sandboxes = _sandboxes(ctx)
    entry = await sandboxes.open(language, packages, owner=_owner(ctx))
    return render.text(
        f"session_id: {entry.session.session_id}\nlanguage: {entry.language}"
        + (f"\npackages: {', '.join(entry.packages)}" if entry.packages else "")
    )


async def exec_code(
    session_id: SessionIdArg,
    code: Annotated[str, Field(description="code to run in the session's interpreter")],
    ctx: Context[Sandboxes, Any],
    timeout_seconds: TimeoutArg = None,
) -> CallToolResult:
    """Run code in an open session's interpreter, where everything earlier calls defined is
    still there; returns exit code, stdout, stderr and rich outputs as run_code does (in python
    the last expression's value is returned, as in a notebook cell). An exception or
    sys.exit() leaves the session and its state intact."""
    entry = _sandboxes(ctx).get(session_id, owner=_owner(ctx))
    progress = OutputProgress(ctx)
    try:
        result = await entry.session.exec(
            code,
            timeout_seconds=timeout_seconds,
            on_stdout=progress.callback,
            on_stderr=progress.callback,
        )
    finally:
        await progress.finish()
    return render.execution(result)


async def close_session(session_id: SessionIdArg, ctx: Context[Sandboxes, Any]) -> CallToolResult:
    """Close a session and destroy its VM (its state and files are gone)."""
    await _sandboxes(ctx).close(session_id, owner=_owner(ctx))
    return render.text(f"session {session_id} closed")


async def write_file(
    session_id: SessionIdArg,
    path: PathArg,
    content: Annotated[str, Field(description="the file's content, in the given encoding")],
    ctx: Context[Sandboxes, Any],
    encoding: Annotated[
        Literal["utf-8", "base64"],
        Field(description="utf-8 for text, base64 for binary content"),
    ] = "utf-8",
    executable: Annotated[bool, Field(description="make the file executable")] = False,
) -> CallToolResult:
    """Write a file into an open session's VM (replacing one at that path; parent directories
    are created). The session's code sees it at once."""
    if encoding == "base64":
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InputValidationError(f"content is not valid base64: {exc}") from None
    else:
        data = content.encode("utf-8")
    entry = _sandboxes(ctx).get(session_id, owner=_owner(ctx))
    await entry.session.write_file(path, data, make_executable=executable)
    return render.text(f"wrote {len(data)} bytes to {path}")


async def read_file(
    session_id: SessionIdArg, path: PathArg, ctx: Context[Sandboxes, Any]
) -> CallToolResult:
    """Read a file of an open session's VM: UTF-8 text as it is, an image as an image, other
    binary content as base64. At most 256 KB: look at parts of larger files with exec."""
    entry = _sandboxes(ctx).get(session_id, owner=_owner(ctx))
    await _check_size(entry.session, path)
    data = await entry.session.read_file(path)
    if data is None:  # only with a destination; kept for the type
        raise InputValidationError(f"{path}: nothing read")
    if len(data) > READ_MAX_BYTES:  # it grew since the size check
        raise InputValidationError(
            f"{path} is {len(data)} bytes, over the {READ_MAX_BYTES} bytes read_file returns"
        )
    return render.file_content(path, data)


async def _check_size(session: SandboxSession, path: str) -> None:
    """Refuse a file over READ_MAX_BYTES before its bytes cross (a file may be 500 MB): its size
    from a listing of its directory. A path that is not listed (a directory, a missing file) is
    left to read_file's own error."""
    parent, _, name = path.rstrip("/").rpartition("/")
    if not name:
        return
    if path.startswith("/") and not parent:
        parent = "/"
    try:
        entries = await session.list_files(parent)
    except SandboxError:
        return
    for info in entries:
        if info.name == name and not info.is_dir and info.size > READ_MAX_BYTES:
            raise InputValidationError(
                f"{path} is {info.size} bytes, over the {READ_MAX_BYTES} bytes read_file "
                "returns: read part of it with exec (e.g. head, or open().read(n))"
            )


async def list_files(
    session_id: SessionIdArg,
    ctx: Context[Sandboxes, Any],
    path: Annotated[
        str, Field(description="a directory; empty or relative: under /home/user")
    ] = "",
) -> CallToolResult:
    """List a directory of an open session's VM: one entry a line, directories ending in "/",
    files with their size."""
    entry = _sandboxes(ctx).get(session_id, owner=_owner(ctx))
    return render.listing(path, await entry.session.list_files(path))


async def pause_session(session_id: SessionIdArg, ctx: Context[Sandboxes, Any]) -> CallToolResult:
    """Save an open session's whole live state (memory, interpreter, files) to disk and close
    its VM; resume_session with the snapshot id brings it back as it was, later, while this
    server runs. The session id is no longer valid afterwards."""
    snapshot = await _sandboxes(ctx).pause(session_id, owner=_owner(ctx))
    return render.text(
        f"snapshot_id: {snapshot.id}\nsize: {snapshot.size_bytes} bytes\n"
        f"exec_count: {snapshot.exec_count}"
    )


async def resume_session(
    snapshot_id: Annotated[str, Field(description="the id pause_session gave")],
    ctx: Context[Sandboxes, Any],
) -> CallToolResult:
    """Bring a session paused by pause_session back: a new session (a new session_id) with the
    state it had when paused. The snapshot stays on disk and may be resumed again."""
    entry = await _sandboxes(ctx).resume(snapshot_id, owner=_owner(ctx))
    return render.text(f"session_id: {entry.session.session_id}\nlanguage: {entry.language}")


async def list_sessions(ctx: Context[Sandboxes, Any]) -> CallToolResult:
    """The sessions open now: id, language, how many exec calls each ran."""
    sandboxes = _sandboxes(ctx)
    open_now = sandboxes.sessions(owner=_owner(ctx))
    lines = [
        f"{e.session.session_id}  {e.language}  exec_count={e.session.exec_count}" for e in open_now
    ]
    lines.append(f"({len(open_now)} of at most {sandboxes.max_sessions} open)")
    return render.text("\n".join(lines))


_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_WRITES = ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False)
# The tools that run code: open world only when the operator gave the VMs network access.
_RUNS = ToolAnnotations(open_world_hint=False)
_TOOLS: tuple[tuple[str, _ToolFn, str, ToolAnnotations], ...] = (
    ("run_code", run_code, "Run code in a fresh sandbox", _RUNS),
    ("open_session", open_session, "Open a sandbox session", _RUNS),
    ("exec", exec_code, "Run code in a session", _RUNS),
    ("close_session", close_session, "Close a session", _WRITES),
    ("write_file", write_file, "Write a file in a session", _WRITES),
    ("read_file", read_file, "Read a file of a session", _READ_ONLY),
    ("list_files", list_files, "List a directory of a session", _READ_ONLY),
    ("pause_session", pause_session, "Pause a session to disk", _RUNS),
    ("resume_session", resume_session, "Resume a paused session", _RUNS),
    ("list_sessions", list_sessions, "List open sessions", _READ_ONLY),
)
TOOL_NAMES = tuple(name for name, _, _, _ in _TOOLS)


class _Server(MCPServer[Sandboxes]):
    """MCPServer whose refusals of a call's arguments read as the library's: the SDK checks
    them against the tool's schema before the tool runs, and says so in pydantic's words (with
    a link to pydantic's site, noise to a model); here they are `input_validation:` and each
    argument's problem, as the tools' own refusals are."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Sandboxes, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            invalid = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(invalid, ValidationError):
                raise
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
                for error in invalid.errors(include_url=False, include_input=False)
            )
            return render.exception(InputValidationError(f"{name}: {problems}"))


def build_server(
    sandboxes: Callable[[], AbstractAsyncContextManager[Sandboxes]],
    *,
    options: RunOptions | None = None,
) -> MCPServer[Sandboxes]:
    """The MCP server of the tools. `sandboxes` is entered once per run of the server (the stdio
    connection, or the HTTP app's life) and left when it stops. options: what every VM gets
    (Sandboxes'), here for what the model is told about network access."""
    options = options or {}
    network = bool(options.get("allow_network"))
    domains = options.get("allowed_domains")
    if not network:
        reach = "The VMs have no network access."
    elif domains:
        reach = f"The VMs may connect to these names and their subdomains: {', '.join(domains)}."
    else:
        reach = "The VMs may connect to public names on the internet."

    @asynccontextmanager
    async def lifespan(_: MCPServer[Sandboxes]) -> AsyncIterator[Sandboxes]:
        async with sandboxes() as state:
            yield state

    try:
        server_version = version("exec-sandbox")
    except PackageNotFoundError:  # run from a source tree
        server_version = "0"
    server: MCPServer[Sandboxes] = _Server(
        "exec-sandbox",
        title="exec-sandbox",
        instructions=f"{INSTRUCTIONS} {reach}",
        version=server_version,
        lifespan=lifespan,
        log_level="WARNING",
    )
    for name, fn, title, hints in _TOOLS:
        if network and hints is _RUNS:
            hints = ToolAnnotations(open_world_hint=True)
        # The docstring as one paragraph: its line breaks are the source's, not the model's.
        description = " ".join((fn.__doc__ or "").split())
        server.add_tool(
            _tool_errors(fn), name=name, title=title, description=description, annotations=hints
        )
    return server
