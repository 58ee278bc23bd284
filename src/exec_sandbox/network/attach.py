"""Giving one VM its network: what a run() or session() does between validating its arguments
and running user code. Listeners are bound first (a busy port fails before any VM starts);
once the VM is up, its port is handed to the relay, NET_CONFIG is sent (the guest's DNS stub,
listeners and CA bundle are set before user code can run), and the listeners start accepting."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import TYPE_CHECKING

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
        return cls(request, policy, bundle, listeners)

    @property
    def exposed(self) -> list[ExposedPort]:
        return [exposed for _sock, exposed in self._listeners]

    async def attach(self, hub: NetworkHub, vm: GuestVm) -> VmNetwork:
        """Relay vm's network port, configure the guest, start the listeners. The listeners
        then belong to the VM's network (closed with the VM); on failure the caller closes the
        VM, which closes them."""
        net = vm.attach_network(hub, self.policy)
        listeners, self._listeners = self._listeners, []
        net.serve(listeners)  # accepted connections wait in the relay until the guest answers
        await vm.send_net_config(build_net_config(self.policy, self.ca_bundle))
        return net

    def discard(self) -> None:
        """Close the listeners of a setup that was never attached. Idempotent."""
        for sock, _exposed in self._listeners:
            sock.close()
        self._listeners = []
