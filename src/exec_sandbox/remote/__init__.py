"""The Python client of `sbx serve` (docs/server.md, "Python client"): `RemoteScheduler` has
Scheduler's API, `RemoteSession` Session's, over the server's Unix socket or TCP with a token.
Needs the `remote` extra (httpx, websockets)."""

from .processes import RemoteProcess, RemoteProcessOutput, RemoteTerminal
from .scheduler import RemoteScheduler
from .session import RemoteSession

__all__ = [
    "RemoteProcess",
    "RemoteProcessOutput",
    "RemoteScheduler",
    "RemoteSession",
    "RemoteTerminal",
]
