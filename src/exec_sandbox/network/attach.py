"""Giving one VM its network: what a run() or session() does between validating its arguments
and running user code. Listeners are bound first (a busy port fails before any VM starts);
once the VM is up, its port is handed to the relay, NET_CONFIG is sent (the guest's DNS stub,
listeners and CA bundle are set before user code can run), and the listeners start accepting."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CommunicationError
from ..models import ExposedPort
from .config_frame import build_net_config, read_ca_bundle, system_ca_bundle_path
from .hub import NetworkHub, VmNetwork
from .policy import NetworkPolicy
from .ports import bind_listeners
from .request import NetworkRequest

if TYPE_CHECKING:
    from ..config import SchedulerConfig
    from ..vm.guest import GuestVm


class NetworkSetup:
    """One call's network before and while it is attached to a VM."""

    def __init__(
        self,
        request: NetworkRequest,
        policy: NetworkPolicy,
        ca_bundle: bytes,
        listeners: list[tuple[socket.socket, ExposedPort]],
    ) -> None:
        self.request = request
        self.policy = policy
        self.ca_bundle = ca_bundle
        self._listeners = listeners

    @classmethod
    async def prepare(cls, request: NetworkRequest, config: SchedulerConfig) -> NetworkSetup:
        """Bind the listeners and read the CA bundle (off the loop). Raises
        NetworkValidationError for a busy port."""
        policy = NetworkPolicy(
            outbound=request.outbound,
            rules=request.rules,
            private_ok=config.network_allow_private_ranges,
            test_hosts=dict(config.network_test_hosts),
        )
        path: Path | None = config.network_ca_bundle
        loop = asyncio.get_running_loop()
        if path is None and request.outbound:
            path = await loop.run_in_executor(None, system_ca_bundle_path)
        bundle = await loop.run_in_executor(None, read_ca_bundle, path) if request.outbound else b""
        listeners = bind_listeners(request.ports)
        return cls(request.bound(), policy, bundle, listeners)

    @property
    def placeholder_env(self) -> dict[str, str]:
        """The environment variables of the call's secrets: this VM's placeholders."""
        return self.request.placeholder_env

    @property
    def exposed(self) -> list[ExposedPort]:
        return [exposed for _sock, exposed in self._listeners]

    async def attach(self, hub: NetworkHub, vm: GuestVm, *, reattach: bool = False) -> VmNetwork:
        """Relay vm's network port, configure the guest, start the listeners. The listeners
        then belong to the VM's network (closed with the VM); on failure the caller closes the
        VM, which closes them. reattach: vm was restored from a state saved with network (a
        resumed or forked session): the guest resets the streams of its old host first."""
        bundle = self.ca_bundle
        if self.request.intercepts_tls:
            # The guest trusts the scheduler's interception CA besides the usual bundle.
            ca = await hub.intercept_ca()
            bundle = (bundle.rstrip(b"\n") + b"\n" if bundle else b"") + ca.pem
        config = build_net_config(self.policy, bundle)
        if reattach:
            # Before the relay reads the port: what the guest queued for its old host is skipped.
            await vm.send_net_config(config, reattach=True)
            await skip_to_reattach_mark(vm.net_fd)
        net = vm.attach_network(hub, self.policy)
        net.request = self.request
        listeners, self._listeners = self._listeners, []
        net.serve(listeners)  # accepted connections wait in the relay until the guest answers
        if not reattach:
            await vm.send_net_config(config)
        return net

    def discard(self) -> None:
        """Close the listeners of a setup that was never attached. Idempotent."""
        for sock, _exposed in self._listeners:
            sock.close()
        self._listeners = []


# net_protocol.h, SBX_NET_REATTACH_MARK: the guest's first bytes after a REATTACH.
REATTACH_MARK = b"\xff\xff\xff\xffsbx-net-reattached\xff\xff\xff\xff"
# What may come before it: the guest's queue for the port (SBX_NET_OUT_HIGH_WATER and a turn's
# frames) and what QEMU's device held; far above both. More is a guest not playing along.
_STALE_MAX = 4 << 20
_MARK_TIMEOUT_SECONDS = 10.0


async def skip_to_reattach_mark(net_fd: int) -> None:
    """Consume the net port's bytes up to and including the guest's reattach mark, leaving
    the frames after it for the relay. CommunicationError when it does not come in time or
    within _STALE_MAX bytes (the caller closes the VM)."""
    # A socketpair end (vm.c): MSG_PEEK works. MSG_DONTWAIT leaves the shared fd's flags alone.
    sock = socket.socket(fileno=os.dup(net_fd))
    deadline = time.monotonic() + _MARK_TIMEOUT_SECONDS
    skipped = 0
    try:
        while True:
            try:
                seen = sock.recv(64 * 1024, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                seen = None
            if seen == b"":
                raise CommunicationError("the VM's network port closed before it reattached")
            if seen:
                at = seen.find(REATTACH_MARK)
                if at >= 0:
                    _consume(sock, at + len(REATTACH_MARK))
                    return
                # Keep a tail that may be the start of the mark.
                drop = len(seen) - (len(REATTACH_MARK) - 1)
                if drop > 0:
                    _consume(sock, drop)
                    skipped += drop
                    if skipped > _STALE_MAX:
                        raise CommunicationError(
                            "the guest sent no reattach mark on its network port"
                        )
                    continue
            if time.monotonic() > deadline:
                raise CommunicationError("the guest did not reattach its network in time")
            await asyncio.sleep(0.01)
    finally:
        sock.close()


def _consume(sock: socket.socket, count: int) -> None:
    """Take count bytes already peeked (there: nothing else reads the port yet)."""
    while count > 0:
        count -= len(sock.recv(min(count, 64 * 1024), socket.MSG_DONTWAIT))
