"""One call's network arguments, validated together before any VM starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
