"""One call's network arguments, validated together before any VM starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..models import PortMapping
from .names import DomainRule, NetworkValidationError, parse_allowed_domains
from .ports import parse_expose_ports
from .secrets import BoundSecret, HeaderRule, Secret, bind_placeholders, parse_secrets


@dataclass(frozen=True)
class NetworkRequest:
    """allow_network, allowed_domains (None: every public name), expose_ports, secrets and
    http_headers of a call. The secrets' placeholders are set per VM (`bound`)."""

    outbound: bool
    rules: tuple[DomainRule, ...] | None
    ports: tuple[PortMapping, ...]
    secrets: tuple[BoundSecret, ...] = field(default=(), repr=False)
    header_rules: tuple[HeaderRule, ...] = field(default=(), repr=False)

    def bound(self) -> NetworkRequest:
        """This request with fresh placeholders for one VM (kept if it has them: a fork's
        copies run the code that read its parent's)."""
        if all(s.placeholder for s in self.secrets):
            return self
        return replace(self, secrets=bind_placeholders(self.secrets))

    @property
    def intercepts_tls(self) -> bool:
        """Whether some host of a secret or header rule is reached over TLS (port 443)."""
        hosts = [h for s in self.secrets for h in s.hosts] + [r.host for r in self.header_rules]
        return any(h.port in (None, 443) for h in hosts)

    @property
    def placeholder_env(self) -> dict[str, str]:
        """What the guest's environment holds for the secrets (after bound())."""
        return {s.name: s.placeholder for s in self.secrets if s.placeholder}


def parse_network_request(
    allow_network: bool,
    allowed_domains: Sequence[str] | None,
    expose_ports: Sequence[int | PortMapping] | None,
    secrets: Sequence[Secret] | None = None,
    http_headers: Mapping[str, Mapping[str, str]] | None = None,
) -> NetworkRequest | None:
    """None when the call wants no network at all (the VM then has no network port)."""
    if not isinstance(allow_network, bool):
        raise NetworkValidationError(f"allow_network must be a bool, got {allow_network!r}")
    rules = parse_allowed_domains(allowed_domains)
    if rules is not None and not allow_network:
        raise NetworkValidationError("allowed_domains needs allow_network=True")
    ports = parse_expose_ports(expose_ports)
    bound, header_rules = parse_secrets(secrets, http_headers, outbound=allow_network, rules=rules)
    if not allow_network and not ports:
        return None
    return NetworkRequest(allow_network, rules, ports, bound, header_rules)


def request_to_meta(request: NetworkRequest) -> dict[str, object]:
    """A session's network request as a paused session's metadata keeps it (JSON), in the
    caller's own terms: request_from_meta validates it again like a call's arguments. Secrets
    and header rules are left out on purpose (their values are never written to disk): a
    resumed session's requests go out with the placeholders."""
    return {
        "allow_network": request.outbound,
        "allowed_domains": None
        if request.rules is None
        else [r.name if r.port is None else f"{r.name}:{r.port}" for r in request.rules],
        "expose_ports": [[m.internal, m.external] for m in request.ports],
    }


def network_request_of(options: Mapping[str, Any]) -> NetworkRequest | None:
    """parse_network_request of run()/session() options (run_request.RunOptions) by name."""
    return parse_network_request(
        options.get("allow_network", False),
        options.get("allowed_domains"),
        options.get("expose_ports"),
        options.get("secrets"),
        options.get("http_headers"),
    )


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
