"""One call's network arguments, validated together before any VM starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..models import PortMapping
from .names import DomainRule, NetworkValidationError, parse_allowed_domains
from .ports import parse_expose_ports


@dataclass(frozen=True)
class NetworkRequest:
    """allow_network, allowed_domains (None: every public name) and expose_ports of a call."""

    outbound: bool
    rules: tuple[DomainRule, ...] | None
    ports: tuple[PortMapping, ...]


def parse_network_request(
    allow_network: bool,
    allowed_domains: Sequence[str] | None,
    expose_ports: Sequence[int | PortMapping] | None,
) -> NetworkRequest | None:
    """None when the call wants no network at all (the VM then has no network port)."""
    if not isinstance(allow_network, bool):
        raise NetworkValidationError(f"allow_network must be a bool, got {allow_network!r}")
    rules = parse_allowed_domains(allowed_domains)
    if rules is not None and not allow_network:
        raise NetworkValidationError("allowed_domains needs allow_network=True")
    ports = parse_expose_ports(expose_ports)
    if not allow_network and not ports:
        return None
    return NetworkRequest(outbound=allow_network, rules=rules, ports=ports)


def request_to_meta(request: NetworkRequest) -> dict[str, object]:
    """A session's network request as a paused session's metadata keeps it (JSON), in the
    caller's own terms: request_from_meta validates it again like a call's arguments."""
    return {
        "allow_network": request.outbound,
        "allowed_domains": None
        if request.rules is None
        else [r.name if r.port is None else f"{r.name}:{r.port}" for r in request.rules],
        "expose_ports": [[m.internal, m.external] for m in request.ports],
    }


def request_from_meta(meta: object) -> NetworkRequest | None:
    """request_to_meta's inverse; NetworkValidationError for anything else (a damaged file)."""
    if not isinstance(meta, dict):
        raise NetworkValidationError("the saved network request is not an object")
    ports = meta.get("expose_ports")
    if not isinstance(ports, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) for p in ports
    ):
        raise NetworkValidationError("the saved exposed ports are malformed")
    mappings = [PortMapping(int(p[0]), None if p[1] is None else int(p[1])) for p in ports]
    return parse_network_request(
        meta.get("allow_network", False),  # its type checked there
        meta.get("allowed_domains"),
        mappings,
    )


def with_free_ports(request: NetworkRequest) -> NetworkRequest:
    """The same request with every exposed port on a host port of the host's choice (a fork's
    copies, or a resumed session whose fixed port is taken)."""
    return replace(request, ports=tuple(PortMapping(m.internal) for m in request.ports))
