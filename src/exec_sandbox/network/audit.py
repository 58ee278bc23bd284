"""The connection log of a run or session: every stream a guest asked for (outbound) or a host
client opened to an exposed port (inbound), allowed or not, with what it carried."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class NetworkConnection:
    """One connection attempt.

    direction: "outbound" (guest code connected to name:port) or "inbound" (a host client of an
    exposed port; name is "127.0.0.1", port the guest port); allowed: the host let it through
    (and, outbound, connected); reason: why it was refused or failed ("" otherwise);
    addresses: what the host resolved the name to (outbound); bytes_sent: guest -> peer;
    bytes_received: peer -> guest; duration_ms: from the request to the end of the stream (or
    the refusal); started_at: time.time() of the request."""

    direction: Literal["outbound", "inbound"]
    name: str
    port: int
    allowed: bool
    reason: str = ""
    addresses: tuple[str, ...] = ()
    bytes_sent: int = 0
    bytes_received: int = 0
    duration_ms: int = 0
    started_at: float = 0.0


@dataclass
class PendingConnection:
    """A NetworkConnection being recorded (mutable until the stream ends)."""

    direction: Literal["outbound", "inbound"]
    name: str
    port: int
    started_at: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    allowed: bool = False
    reason: str = ""
    addresses: tuple[str, ...] = ()
    bytes_sent: int = 0
    bytes_received: int = 0
    ended_mono: float | None = None

    def finish(self) -> NetworkConnection:
        end = self.ended_mono if self.ended_mono is not None else time.monotonic()
        return NetworkConnection(
            direction=self.direction, name=self.name, port=self.port, allowed=self.allowed,
            reason=self.reason, addresses=self.addresses, bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            duration_ms=max(0, round((end - self.started_mono) * 1000)),
            started_at=self.started_at,
        )  # fmt: skip
