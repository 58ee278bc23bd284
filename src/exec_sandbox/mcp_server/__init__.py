"""`sbx mcp`: the sandbox as Model Context Protocol tools (docs/mcp.md), on the official `mcp`
SDK (the `server` extra). Named mcp_server so that it never shadows that package."""

from .serve import LOOPBACK_ONLY, SchedulerFactory, http_app, serve_stdio
from .sessions import DEFAULT_MAX_SESSIONS, Sandboxes
from .tools import TOOL_NAMES, build_server

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "LOOPBACK_ONLY",
    "TOOL_NAMES",
    "Sandboxes",
    "SchedulerFactory",
    "build_server",
    "http_app",
    "serve_stdio",
]
