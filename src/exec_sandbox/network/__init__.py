"""Network by name: the host's policy and bookkeeping around the C relay.

The guest has no network device. Its agent turns each TCP connection to an allowed name into a
stream on the VM's network port; the C relay (src/_execsbx/net_relay.c) carries the bytes and
hands this package only events. Here: which names and ports a VM may reach (names.py), which
addresses never (addresses.py), resolving and connecting (policy.py), exposed ports (ports.py),
the connection log (audit.py), and the per-scheduler hub that ties them to the loop (hub.py)."""

from ..models import NetworkConnection
from .names import NetworkValidationError
from .request import NetworkRequest, parse_network_request

__all__ = ["NetworkConnection", "NetworkRequest", "NetworkValidationError", "parse_network_request"]
