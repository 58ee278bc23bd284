"""The network of the VMs of one Scheduler: one NetRing (the C relay on io_uring) registered on
the event loop, and per VM a VmNetwork that answers the guest's OPENs with the policy, opens
streams for exposed ports, and keeps the connection log. Bytes never pass through here."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..models import ExposedPort, HttpRequestRecord, NetworkConnection
from ..vm.binding import (
    NetClosedEvent,
    NetConnectedEvent,
    NetGuestRefusedEvent,
    NetOpenEvent,
    NetRefusedEvent,
    NetRelayEndEvent,
    NetRing,
)
from . import policy as p
from .audit import PendingConnection
from .intercept import Interception, is_tls_port
from .policy import NetworkPolicy, Refused
from .request import NetworkRequest
from .secrets import HostSecrets
from .tls_ca import InterceptCa, upstream_context

if TYPE_CHECKING:
    from ..vm.binding import NetEvent

log = logging.getLogger(__name__)

# Inbound (the host cannot open one more stream) and outbound (the relay refused the guest's OPEN
# with TOO_MANY) alike: streams of both directions share the per-VM table (net_protocol.h).
TOO_MANY_REASON = "the VM has the most streams open (both directions together)"
# Entries a VM's guest may add to its log by its reports (NET_REFUSED); the relay already bounds
# their rate, this their number over a long session. Beyond it they are only counted.
GUEST_REPORTS_MAX = 1000
GUEST_REFUSAL_REASONS = {
    "name": "refused by the guest: the name is not in allowed_domains (its DNS stub said NXDOMAIN)",
    "address": "refused by the guest: no allowed name has this address (an IP literal or an"
    " unassigned synthetic address)",
}


class NetworkHub:
    """One per Scheduler (created on first use, closed with it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ring = NetRing()
        self._vms: dict[int, VmNetwork] = {}
        self._ca: InterceptCa | None = None
        self._upstream_tls: ssl.SSLContext | None = None
        self._ca_lock = asyncio.Lock()
        loop.add_reader(self._ring.fileno(), self._on_ready)

    async def intercept_ca(self) -> InterceptCa:
        """The scheduler's CA for secrets' TLS hosts, made on first use (off the loop)."""
        async with self._ca_lock:
            if self._ca is None:
                self._ca = await self._loop.run_in_executor(None, InterceptCa)
            return self._ca

    def upstream_tls(self) -> ssl.SSLContext:
        """The context verifying secrets' real hosts (the host's trust store, read once)."""
        if self._upstream_tls is None:
            self._upstream_tls = upstream_context()
        return self._upstream_tls

    def attach(
        self, port_fd: int, policy: NetworkPolicy, on_violation: Callable[[str], None]
    ) -> VmNetwork:
        """Start relaying a VM's network port (the fd stays the caller's: the ring has a copy)."""
        relay = self._ring.add_relay(port_fd)
        net = VmNetwork(self, relay, policy, on_violation)
        self._vms[relay] = net
        return net

    def live(self) -> int:
        """Relays and streams the C side still holds (tests: teardown is complete at 0)."""
        return self._ring.live()

    def close(self) -> None:
        if self._ring.closed:
            return
        for net in list(self._vms.values()):
            net.close()
        self._loop.remove_reader(self._ring.fileno())
        self._ring.close()
        if self._ca is not None:
            self._ca.close()
            self._ca = None

    def _on_ready(self) -> None:
        try:
            events = self._ring.run()
        except OSError as exc:  # io_uring_submit failed: the events are lost; nothing to do
            log.error("network relay: %s", exc)
            return
        for event in events:
            net = self._vms.get(event.relay)
            if net is not None:
                net._on_event(event)

    def _forget(self, net: VmNetwork) -> None:
        if self._vms.pop(net.relay, None) is not None and not self._ring.closed:
            self._ring.close_relay(net.relay)


class VmNetwork:
    """The network side of one VM: policy decisions, exposed-port listeners, the log."""

    def __init__(
        self,
        hub: NetworkHub,
        relay: int,
        policy: NetworkPolicy,
        on_violation: Callable[[str], None],
    ) -> None:
        self.hub = hub
        self.relay = relay
        self.policy = policy
        self.exposed: list[ExposedPort] = []
        # What the call asked (NetworkSetup.attach): a paused or forked session's network is
        # set up again from it (snapshots/service.py).
        self.request: NetworkRequest | None = None
        self._on_violation = on_violation
        self._pending: dict[int, PendingConnection] = {}
        self._log: list[NetworkConnection] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[tuple[socket.socket, int]] = []
        self._closed = False
        self._guest_reports = 0
        self._guest_dropped: tuple[int, PendingConnection] | None = None  # (index in _log, entry)

    @property
    def log(self) -> list[NetworkConnection]:
        """Finished connections, oldest first, then those still open (as they stand now)."""
        return [
            *self._log,
            *(rec.finish(still_open=True) for rec in self._pending.values() if rec.allowed),
        ]

    def inject_from_guest(self, data: bytes) -> None:
        """TESTS ONLY: handle data as if the guest had written it on its port (a lying guest:
        user code cannot open the port itself). At most one maximal frame per call."""
        self.hub._ring.ingest(self.relay, data)
        self.hub._on_ready()

    # --- exposed ports ---

    def serve(self, listeners: list[tuple[socket.socket, ExposedPort]]) -> None:
        """Start accepting on bound, listening sockets (owned from now on)."""
        for sock, exposed in listeners:
            self._listeners.append((sock, exposed.internal))
            self.exposed.append(exposed)
            self.hub._loop.add_reader(sock.fileno(), self._on_accept, sock, exposed.internal)

    def _on_accept(self, listener: socket.socket, guest_port: int) -> None:
        for _ in range(16):
            try:
                conn, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept on exposed port for guest port %d: %s", guest_port, exc)
                return
            rec = PendingConnection("inbound", "127.0.0.1", guest_port)
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    stream = self.hub._ring.connect(self.relay, guest_port, conn)
                except OSError as exc:
                    self._log_refused(
                        rec,
                        TOO_MANY_REASON
                        if exc.errno == errno.EBUSY
                        else f"the VM's network is gone ({exc.strerror})",
                    )
                    continue
            self._pending[stream] = rec

    # --- events from the relay ---

    def _on_event(self, event: NetEvent) -> None:
        if isinstance(event, NetOpenEvent):
            rec = PendingConnection("outbound", event.name, event.port)
            self._pending[event.stream] = rec
            task = asyncio.get_running_loop().create_task(self._decide(event.stream, rec))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(event, NetConnectedEvent):
            waiting = self._pending.get(event.stream)
            if waiting is None:
                return
            if event.status == p.OK:
                waiting.allowed = True
            else:
                del self._pending[event.stream]
                self._log_refused(
                    waiting, f"nothing accepted the connection in the guest (status {event.status})"
                )
        elif isinstance(event, NetClosedEvent):
            ended = self._pending.pop(event.stream, None)
            if ended is None:
                return
            ended.bytes_received = event.bytes_to_guest
            ended.bytes_sent = event.bytes_from_guest
            if not ended.allowed and not ended.reason:
                ended.reason = "closed by the guest before the host decided"
            elif event.reset and not ended.reason:
                ended.reason = "reset"
            self._log.append(ended.finish())
        elif isinstance(event, NetRefusedEvent):
            # The relay answered this OPEN itself (the table was full): nothing to decide, but
            # it was a connection attempt all the same, and the log holds every attempt.
            self._log_refused(
                PendingConnection("outbound", event.name, event.port),
                TOO_MANY_REASON
                if event.status == p.TOO_MANY
                else f"refused by the relay (status {event.status})",
            )
        elif isinstance(event, NetGuestRefusedEvent):
            self._guest_refused(event)
        elif isinstance(event, NetRelayEndEvent) and event.kind == "violation":
            log.warning("VM network protocol violation: %s", event.reason)
            self._on_violation(event.reason)
        # "port_closed": the VM is going away; its close() tidies up.

    def _guest_refused(self, event: NetGuestRefusedEvent) -> None:
        """An attempt the guest refused itself: logged as it says (up to GUEST_REPORTS_MAX), the
        rest counted into one entry kept up to date."""
        if event.what != "dropped" and self._guest_reports < GUEST_REPORTS_MAX:
            self._guest_reports += 1
            rec = PendingConnection("outbound", event.subject, event.port, reported_by_guest=True)
            self._log_refused(rec, GUEST_REFUSAL_REASONS[event.what])
            return
        dropped = event.attempts
        if self._guest_dropped is None:
            rec = PendingConnection("outbound", "", 0, reported_by_guest=True)
            self._guest_dropped = (len(self._log), rec)
            self._log.append(rec.finish())
        index, rec = self._guest_dropped
        dropped += int(rec.reason.split(" ", 1)[0]) if rec.reason else 0
        rec.reason = f"{dropped} more attempts refused by the guest were not logged (rate limit)"
        rec.started_at = time.time()
        self._log[index] = rec.finish()

    def _log_refused(self, rec: PendingConnection, reason: str) -> None:
        """Log an attempt that ends without carrying a byte (refused or turned away)."""
        rec.reason = reason
        self._log.append(rec.finish())

    async def _decide(self, stream: int, rec: PendingConnection) -> None:
        ring = self.hub._ring
        try:
            why = self.policy.check(rec.name, rec.port)
            if why is not None:
                raise Refused(p.REFUSED_POLICY, why)
            targets = await p.resolve(self.policy, rec.name, rec.port)
            rec.addresses = tuple(a for a, _ in targets)
            sock = await p.connect(targets, rec.name)
        except Refused as refused:
            rec.addresses = refused.addresses or rec.addresses
            if self._pending.pop(stream, None) is rec:
                self._log_refused(rec, refused.reason)
                if not self._closed:
                    ring.open_reply(self.relay, stream, refused.status, refused.reason[:256])
            return
        secrets = None if self.request is None else self._host_secrets(rec.name, rec.port)
        if secrets is not None:
            await self._intercept(stream, rec, sock, secrets)
            return
        with sock:
            if self._closed or self._pending.get(stream) is not rec:
                return  # the guest gave up (or the VM went) while the host connected
            rec.allowed = True
            if not ring.open_reply(self.relay, stream, p.OK, "", sock):
                rec.allowed = False
                rec.reason = "closed by the guest before the host connected"

    def _host_secrets(self, name: str, port: int) -> HostSecrets | None:
        assert self.request is not None
        return HostSecrets.for_host(self.request.secrets, self.request.header_rules, name, port)

    async def _intercept(
        self, stream: int, rec: PendingConnection, sock: socket.socket, secrets: HostSecrets
    ) -> None:
        """A stream to a secret's host: the relay gets one end of a socketpair, intercept.py
        the other and the socket to the real host (docs/design.md, "Secrets")."""
        try:
            tls = await self.hub.intercept_ca() if is_tls_port(rec.port) else None
            guest_tls = (
                None
                if tls is None
                else await self.hub._loop.run_in_executor(None, tls.server_context, rec.name)
            )
        except (OSError, subprocess.SubprocessError, ssl.SSLError, ValueError) as exc:
            sock.close()
            log.error("secrets: no certificate for %s: %s", rec.name, exc)
            if self._pending.pop(stream, None) is rec:
                reason = f"the host could not make a certificate for {rec.name}: {exc}"
                self._log_refused(rec, reason)
                if not self._closed:
                    self.hub._ring.open_reply(self.relay, stream, p.CONNECT_FAILED, reason[:256])
            return
        except BaseException:
            sock.close()
            raise
        relay_end, ours = socket.socketpair()
        with relay_end:
            if self._closed or self._pending.get(stream) is not rec:
                sock.close()
                ours.close()
                return
            rec.allowed = True
            if not self.hub._ring.open_reply(self.relay, stream, p.OK, "", relay_end):
                rec.allowed = False
                rec.reason = "closed by the guest before the host connected"
                sock.close()
                ours.close()
                return
        ours.setblocking(False)

        def on_record(record: HttpRequestRecord) -> None:
            rec.http_requests.append(record)

        interception = Interception(rec.name, rec.port, secrets, on_record)
        upstream_tls = None if tls is None else self.hub.upstream_tls()
        task = asyncio.get_running_loop().create_task(
            interception.serve(ours, sock, guest_tls, upstream_tls)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> list[NetworkConnection]:
        """Stop everything of this VM (listeners, streams, pending decisions); returns the log.
        Idempotent."""
        if not self._closed:
            self._closed = True
            for sock, _port in self._listeners:
                self.hub._loop.remove_reader(sock.fileno())
                sock.close()
            self._listeners.clear()
            for task in self._tasks:
                task.cancel()
            now_open = [rec for rec in self._pending.values()]
            self._pending.clear()
            for rec in now_open:
                if not rec.reason and not rec.allowed:
                    rec.reason = "the VM was closed"
                self._log.append(rec.finish())
            self.hub._forget(self)
        return list(self._log)
