"""Running the server: the listeners, the Scheduler and the Hub, and their orderly end.

One Scheduler and one Hub serve every listener; each listener gets its own authentication in
front of the same routes (auth.py): the Unix socket (mode 0600 in a 0700 directory: its owner
only) is `local` with every scope, TCP needs bearer tokens. SIGTERM or SIGINT stop the
listeners, let requests in flight end (a few seconds), pause or close the sessions
(--on-shutdown), close the Scheduler (no QEMU outlives it) and remove the socket file. A socket
file left by a killed server is replaced; one a live server answers on is refused."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from ..config import SchedulerConfig
from ..scheduler import Scheduler
from .app import create_app
from .auth import Authenticate
from .hub import Hub, OnShutdown
from .mounts import WithPrincipal
from .tokens import TokenStore

log = logging.getLogger(__name__)

# Requests and streams still running when the server is told to stop get this long to end.
GRACEFUL_SECONDS = 5
# A WebSocket message from a client (a run's request is at most ~8 MB of JSON).
WS_MAX_BYTES = 8 << 20
# How long an idle connection on the Unix socket stays open. An agent's calls come seconds
# apart (a model thinks between them); with uvicorn's 5 s each such call paid a new connection.
# Longer than the client's own keep-alive (remote/_connection.py), so that it is the client
# that closes an idle connection, never the server just as a request is sent on it. TCP keeps
# uvicorn's 5 s: idle connections from the network are not held for long.
UNIX_KEEP_ALIVE_SECONDS = 120
TCP_KEEP_ALIVE_SECONDS = 5


# An app mounted beside the routes, made on the server's Scheduler (serve(mounts=...)).
MountFactory = Callable[[Scheduler], contextlib.AbstractAsyncContextManager[ASGIApp]]


class ServeError(Exception):
    """The server cannot start as asked (a live server on the socket, a bad address)."""


@dataclasses.dataclass
class ServeOptions:
    socket_path: Path | None  # None: no Unix socket
    port: int | None  # None: no TCP listener
    host: str = "127.0.0.1"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    on_shutdown: OnShutdown = "pause"
    max_sessions_per_token: int | None = None
    max_vms_per_token: int | None = None


def check_address(options: ServeOptions, warn: Callable[[str], None]) -> None:
    """A non-loopback address is the caller's explicit choice (--host); without TLS its tokens
    and code cross the network in clear text: said loudly."""
    if (options.tls_cert is None) != (options.tls_key is None):
        raise ServeError("--tls-cert and --tls-key go together")
    if options.port is None:
        return
    try:
        loopback = ipaddress.ip_address(options.host).is_loopback
    except ValueError:
        loopback = options.host == "localhost"
    if not loopback and options.tls_cert is None:
        warn(
            f"WARNING: listening on {options.host} without TLS: tokens, code and results cross "
            "the network in clear text; anyone on the path can use the tokens. Pass --tls-cert "
            "and --tls-key, or keep to 127.0.0.1 and a tunnel."
        )


def bind_unix(path: Path) -> socket.socket:
    """A listening socket at path, mode 0600, in a 0700 directory. A stale file (nothing
    answers on it) is replaced; a live server's is refused. The directory must be this user's
    (or root's) and writable by no one else: in a shared one (/tmp) another user could put a
    socket of theirs at the path first, or in its place later, and clients would trust it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    parent = path.parent.stat()
    if parent.st_uid not in (0, os.geteuid()) or parent.st_mode & 0o022:
        raise ServeError(
            f"{path.parent} is writable by other users (or not yours): another user could "
            "replace the socket there; put it in a directory only you can write, as the "
            "default is"
        )
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise ServeError(f"{path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink(missing_ok=True)  # its server is gone
            else:
                raise ServeError(f"a server is already listening on {path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # never reachable by others, not even between bind and chmod
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), backlog=128, reuse_port=False)
    # Accepted connections inherit it. asyncio sets it only on sockets whose proto is
    # IPPROTO_TCP, and create_server's is 0: without it, an answer written in two parts (head,
    # body) waits for the client's delayed ACK, 40 ms per call on a kept-alive connection.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


def _quiet_below_info(logger: logging.Logger) -> None:
    if logger.getEffectiveLevel() < logging.INFO:
        logger.setLevel(logging.INFO)


class _DeniedHandshakes(logging.Filter):
    """uvicorn's sans-I/O WebSocket protocol logs an ERROR after every handshake the app
    answered with an HTTP response (the ASGI denial-response extension: auth.py's 401 to a bad
    token), since it never marks that path's handshake complete. A refusal is not an error;
    the message is dropped (the server's own handlers always accept or close)."""

    MESSAGE = "ASGI callable returned without completing handshake."

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.MESSAGE


_DENIED_HANDSHAKES = _DeniedHandshakes()


def _server(app: object, options: ServeOptions, tls: bool, keep_alive: int) -> uvicorn.Server:
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        lifespan="off",  # the Scheduler is started and closed here, once for every listener
        timeout_keep_alive=keep_alive,
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,  # a forwarded-for header is the client's word, not used here
        ws="websockets-sansio",
        ws_max_size=WS_MAX_BYTES,
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        ssl_certfile=str(options.tls_cert) if tls and options.tls_cert else None,
        ssl_keyfile=str(options.tls_key) if tls and options.tls_key else None,
    )
    config.load()
    # The WebSocket protocol logs every handshake header at DEBUG, bearer tokens included: its
    # logger stays at INFO even under --debug.
    protocol_log = logging.getLogger("uvicorn.error")
    _quiet_below_info(protocol_log)
    if _DENIED_HANDSHAKES not in protocol_log.filters:
        protocol_log.addFilter(_DENIED_HANDSHAKES)
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    return server


async def serve(
    options: ServeOptions,
    scheduler_config: SchedulerConfig,
    state_dir: Path,
    announce: Callable[[str], None] = print,
    mounts: Mapping[str, MountFactory] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT. announce gets one line per listener once it accepts.

    mounts: path -> a factory of an ASGI app on the server's Scheduler, live while its context
    is (entered before the listeners start, left before the sessions are paused): the MCP
    endpoint at /mcp. A mounted app is behind the same authentication as the routes (the
    caller in request.state.principal, and named by the PRINCIPAL_HEADER header: mounts.py)."""
    check_address(options, lambda text: print(f"sbx serve: {text}", file=sys.stderr))
    if options.socket_path is None and options.port is None:
        raise ServeError("nothing to listen on: give --socket or --port")
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    listeners: list[tuple[uvicorn.Server, socket.socket]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        # Bound first: a second server fails here, before it starts a Scheduler.
        if options.socket_path is not None:
            unix = bind_unix(options.socket_path)
            stack.callback(_remove_socket, options.socket_path, unix)
        tcp = bind_tcp(options.host, options.port) if options.port is not None else None
        if tcp is not None:
            stack.callback(tcp.close)
        scheduler = await stack.enter_async_context(Scheduler(scheduler_config))
        hub = Hub(
            scheduler,
            state_dir,
            on_shutdown=options.on_shutdown,
            max_sessions_per_token=options.max_sessions_per_token,
            max_vms_per_token=options.max_vms_per_token,
        )
        await hub.start()
        stack.push_async_callback(hub.shutdown)  # before the Scheduler closes
        app = create_app(hub)
        # uvicorn's lifespan is off (two listeners share the app): the app's own lifespan (a
        # mounted app's, such as MCP's session manager, hooked into it) runs here, once.
        await stack.enter_async_context(app.router.lifespan_context(app))
        for path, factory in (mounts or {}).items():
            mounted = await stack.enter_async_context(factory(scheduler))
            app.mount(path, WithPrincipal(mounted))
        if options.socket_path is not None:
            server = _server(
                Authenticate(app, None), options, tls=False, keep_alive=UNIX_KEEP_ALIVE_SECONDS
            )
            await server.startup(sockets=[unix])
            listeners.append((server, unix))
            announce(f"sbx serve: listening on unix:{options.socket_path}")
        if tcp is not None:
            tokens = TokenStore(state_dir)
            server = _server(
                Authenticate(app, tokens), options, tls=True, keep_alive=TCP_KEEP_ALIVE_SECONDS
            )
            await server.startup(sockets=[tcp])
            listeners.append((server, tcp))
            host, port = tcp.getsockname()[:2]
            scheme = "https" if options.tls_cert else "http"
            announce(f"sbx serve: listening on {scheme}://{host}:{port}")
        await stop.wait()
        log.info("stopping (open sessions: %s)", options.on_shutdown)
        await asyncio.gather(*(server.shutdown(sockets=[sock]) for server, sock in listeners))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)


def _remove_socket(path: Path, sock: socket.socket) -> None:
    # Still ours: another server refuses to replace a socket this one answers on.
    sock.close()
    path.unlink(missing_ok=True)
