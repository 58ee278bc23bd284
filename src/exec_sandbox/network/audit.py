"""Recording the connection log of a run or session (models.NetworkConnection): every stream a
guest asked for (outbound) or a host client opened to an exposed port (inbound), allowed or not,
with what it carried."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from ..models import HttpRequestRecord, NetworkConnection


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
    reported_by_guest: bool = False
    http_requests: list[HttpRequestRecord] = field(default_factory=list)

    def finish(self, still_open: bool = False) -> NetworkConnection:
        end = self.ended_mono if self.ended_mono is not None else time.monotonic()
        return NetworkConnection(
            direction=self.direction,
            name=self.name,
            port=self.port,
            allowed=self.allowed,
            reason=self.reason,
            addresses=self.addresses,
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            duration_ms=max(0, round((end - self.started_mono) * 1000)),
            started_at=self.started_at,
            still_open=still_open,
            reported_by_guest=self.reported_by_guest,
            http_requests=tuple(self.http_requests),
        )
