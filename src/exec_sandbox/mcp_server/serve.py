"""Running the MCP server: over stdio (`sbx mcp`: one client, the process's life) or as a
streamable-HTTP ASGI app (for `sbx serve` to mount at /mcp).

Either way the scheduler and the open sessions are owned here, outside the SDK's task groups, so
that closing them on the way out is plain awaiting: never inside a cancelled scope, whatever
stopped the server (stdin's EOF, SIGTERM, the ASGI host's shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from ..protocols import SandboxScheduler
from ..run_request import RunOptions
from .sessions import DEFAULT_MAX_SESSIONS, Sandboxes
from .tools import build_server

log = logging.getLogger("exec_sandbox.mcp")

# How long a stopped stdio server may take to wind down before its sessions are closed anyway.
_STOP_SECONDS = 2.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# The Host and Origin headers the HTTP app admits unless told otherwise: loopback names only,
# against DNS rebinding (a web page whose name resolves to 127.0.0.1 sends its own name). The
# SDK's default wants a port in Host; a client of a Unix socket sends none ("localhost").
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
LOOPBACK_ONLY = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=[*_LOOPBACK_NAMES, *(f"{n}:*" for n in _LOOPBACK_NAMES)],
    allowed_origins=[
        *(f"http://{n}" for n in _LOOPBACK_NAMES),
        *(f"http://{n}:*" for n in _LOOPBACK_NAMES),
    ],
)

# MCP connections over HTTP held at once, and how long an unused one is kept.
_HTTP_CONNECTIONS = 256
_HTTP_IDLE_SECONDS = 600.0

# What gives the scheduler the MCP server runs on: entered once, left when the server stops.
# A Scheduler(config) or a RemoteScheduler(...) is one; a scheduler owned elsewhere (sbx serve's)
# is `lambda: contextlib.nullcontext(scheduler)`.
SchedulerFactory = Callable[[], AbstractAsyncContextManager[SandboxScheduler]]


async def serve_stdio(
    scheduler_factory: SchedulerFactory,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    options: RunOptions | None = None,
) -> bool:
    """Serve one MCP client on stdin/stdout until stdin's EOF or SIGTERM (or SIGINT); then close
    every session the client left open and the scheduler. True: the client ended (EOF). False:
    a signal stopped the server while the SDK's stdin reader (a thread blocked in read(), which
    nothing interrupts) may still wait: the caller ends the process (os._exit) instead of
    waiting for it."""
    async with scheduler_factory() as scheduler:
        sandboxes = Sandboxes(scheduler, max_sessions=max_sessions, options=options)
        server = build_server(lambda: contextlib.nullcontext(sandboxes), options=options)
        serving = asyncio.ensure_future(server.run_stdio_async())
        terminated = asyncio.ensure_future(asyncio.Event().wait())
        loop = asyncio.get_running_loop()
        # SIGTERM (and Ctrl-C) end the wait below at once: the server task itself may not
        # finish while its reader thread waits in read().
        for signum in _STOP_SIGNALS:
            loop.add_signal_handler(signum, terminated.cancel)
        try:
            await asyncio.wait([serving, terminated], return_when=asyncio.FIRST_COMPLETED)
            if terminated.done():
                log.info("stopped by a signal: closing the open sessions")
            else:
                serving.result()  # the server's own failure, raised
        finally:
            for signum in _STOP_SIGNALS:
                loop.remove_signal_handler(signum)
            serving.cancel()
            # Bounded: past it, the reader thread is stuck in read() and the caller exits.
            await asyncio.wait([serving], timeout=_STOP_SECONDS)
            stopped = terminated.done()
            terminated.cancel()
            await sandboxes.close_all()
    return not stopped


@asynccontextmanager
async def http_app(
    scheduler_factory: SchedulerFactory,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    options: RunOptions | None = None,
    path: str = "/",
    transport_security: TransportSecuritySettings | None = None,
) -> AsyncIterator[ASGIApp]:
    """The MCP server as a streamable-HTTP ASGI app, served at `path` of the app (mounted at
    /mcp: path "/"), live while the context is: enter it in the ASGI host's lifespan (a mounted
    Starlette app's own lifespan is not run). On exit the MCP sessions end and every sandbox
    session is closed. transport_security: the SDK's Host/Origin checks (default LOOPBACK_ONLY;
    a server reached by another name passes its own).

    A sandbox session belongs to the MCP connection that opened it (sessions.py); it is closed
    by close_session, by the scheduler's idle timeout, or when the app stops: the SDK has no
    hook for the end of an HTTP MCP session."""
    async with scheduler_factory() as scheduler:
        sandboxes = Sandboxes(scheduler, max_sessions=max_sessions, options=options)
        server = build_server(lambda: contextlib.nullcontext(sandboxes), options=options)
        app = server.streamable_http_app(
            streamable_http_path=path,
            transport_security=transport_security or LOOPBACK_ONLY,
            # The SDK's own table of MCP connections (10,000 for 30 minutes by default) is
            # shared by every caller: kept small and short, so that one caller opening
            # connections in a loop holds few and not for long.
            max_sessions=_HTTP_CONNECTIONS,
            session_idle_timeout=_HTTP_IDLE_SECONDS,
        )
        try:
            async with server.session_manager.run():
                yield app
        finally:
            await sandboxes.close_all()
