"""What a `run` token may ask of its VMs beyond plain code (docs/server.md, "Security model"):
network (all names, or some names and their subdomains), exposed ports, secrets and HTTP
headers, and volumes by name (read-write, or forced read-only). A new token has none of them;
the operator grants each with `sbx token create`. Admin tokens, the Unix socket (`local`) and
tokens stored before grants existed (no `grants` in tokens.json) have no Grants: everything.

check() reads a request's options with the library's own parsers, so that what is compared is
what the VM would get (lowercase ASCII names, ports, volume names), and it runs before anything
is reserved or started."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import InputValidationError
from ..network.names import DomainRule, parse_allowed_domains
from ..network.request import network_request_of, parse_network_request
from ..run_request import RunOptions
from ..volumes.volume import VolumeMount, validate_volume_name, validate_volumes

# The CLI's and tokens.json's words for the two volume grants.
READ_ONLY, READ_WRITE = "ro", "rw"


# What every VM made through `sbx serve`'s /mcp gets: nothing a grant covers (no network,
# ports, secrets or volumes), so that no token exceeds its grants there. MCP's tools take no
# such options from the model; `sbx mcp --allow-network` is the operator's, outside the server.
SERVED_MCP_OPTIONS: RunOptions = {}


class NotGranted(Exception):
    """A request asks for something its token was not granted (answered `forbidden`)."""


@dataclasses.dataclass(frozen=True)
class Grants:
    """network: allow_network with any names (or none listed); domains: allow_network limited
    to these names and their subdomains (a request's allowed_domains within them); expose:
    expose_ports (any, the server's choice of host port included); secrets: secrets and
    http_headers; volumes: volume name -> "ro" (mounted read-only whatever is asked) or "rw"."""

    network: bool = False
    domains: tuple[str, ...] = ()
    expose: bool = False
    secrets: bool = False
    volumes: tuple[tuple[str, str], ...] = ()

    @classmethod
    def make(
        cls,
        *,
        network: bool = False,
        domains: Iterable[str] = (),
        expose: bool = False,
        secrets: bool = False,
        volumes: Iterable[str] = (),
    ) -> Grants:
        """Grants of the CLI's words: volumes as "NAME" or "NAME:ro" (or "NAME:rw");
        InputValidationError for a bad domain or volume name."""
        rules = parse_allowed_domains(list(domains)) or ()
        by_name: dict[str, str] = {}
        for text in volumes:
            name, _, mode = str(text).partition(":")
            mode = mode or READ_WRITE
            if mode not in (READ_ONLY, READ_WRITE):
                raise InputValidationError(f"--volume takes NAME[:ro], got {text!r}")
            by_name[validate_volume_name(name)] = mode
        return cls(
            network=bool(network),
            domains=tuple(_rule_text(r) for r in rules),
            expose=bool(expose),
            secrets=bool(secrets),
            volumes=tuple(sorted(by_name.items())),
        )

    # --- tokens.json ---

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "domains": list(self.domains),
            "expose": self.expose,
            "secrets": self.secrets,
            "volumes": dict(self.volumes),
        }

    @classmethod
    def from_json(cls, data: Any) -> Grants:
        """ValueError for anything but what to_json wrote (a damaged file)."""
        if not isinstance(data, Mapping):
            raise ValueError("grants is not an object")
        volumes = data.get("volumes", {})
        domains = data.get("domains", [])
        if not isinstance(volumes, Mapping) or not isinstance(domains, list):
            raise ValueError("grants: volumes is an object, domains a list")
        try:
            return cls.make(
                network=data.get("network") is True,
                domains=domains,
                expose=data.get("expose") is True,
                secrets=data.get("secrets") is True,
                volumes=[f"{name}:{mode}" for name, mode in volumes.items()],
            )
        except InputValidationError as exc:
            raise ValueError(f"grants: {exc}") from None

    def describe(self) -> str:
        """One line for `sbx token list`."""
        parts = []
        if self.network:
            parts.append("network")
        elif self.domains:
            parts.append("domains " + ",".join(self.domains))
        if self.expose:
            parts.append("expose")
        if self.secrets:
            parts.append("secrets")
        if self.volumes:
            parts.append("volumes " + ",".join(f"{n}:{m}" for n, m in self.volumes))
        return "; ".join(parts) or "none"


def _rule_text(rule: DomainRule) -> str:
    return rule.name if rule.port is None else f"{rule.name}:{rule.port}"


def check(grants: Grants | None, options: RunOptions, who: str) -> RunOptions:
    """options if grants allow them, with the volumes granted read-only mounted read-only;
    NotGranted naming the option and the grant missing otherwise. None: everything allowed.
    Options the library would refuse anyway raise its InputValidationError here (bad_request)."""
    if grants is None:
        return options
    network = network_request_of(options)
    if network is not None and network.outbound and not grants.network:
        if network.rules is None:
            raise NotGranted(
                f"token {who!r} may not use allow_network without allowed_domains "
                "(it lacks the network grant: sbx token create --allow-network)"
            )
        granted = parse_allowed_domains(list(grants.domains)) or ()
        for rule in network.rules:
            if not any(_covers(g, rule) for g in granted):
                raise NotGranted(
                    f"token {who!r} may not reach {_rule_text(rule)!r} in allowed_domains "
                    f"(its domain grants: {', '.join(grants.domains) or 'none'}; "
                    "sbx token create --allow-domain D)"
                )
    if network is not None and network.ports and not grants.expose:
        raise NotGranted(
            f"token {who!r} may not use expose_ports "
            "(it lacks the expose grant: sbx token create --allow-expose)"
        )
    for option in ("secrets", "http_headers"):
        if options.get(option) and not grants.secrets:
            raise NotGranted(
                f"token {who!r} may not use {option} "
                "(it lacks the secrets grant: sbx token create --allow-secrets)"
            )
    attaches = validate_volumes(options.get("volumes"))
    if not attaches:
        return options
    allowed = dict(grants.volumes)
    volumes: dict[str, Any] = {}
    for attach in attaches:
        mode = allowed.get(attach.name)
        if mode is None:
            raise NotGranted(
                f"token {who!r} may not mount volume {attach.name!r} in volumes "
                "(no volume grant for it: sbx token create --volume NAME[:ro])"
            )
        volumes[attach.path] = VolumeMount(
            attach.name, read_only=attach.read_only or mode == READ_ONLY
        )
    narrowed = dict(options)
    narrowed["volumes"] = volumes
    return narrowed  # type: ignore[return-value]  # the same keys, volumes rewritten


def _covers(grant: DomainRule, rule: DomainRule) -> bool:
    """The granted name covers the asked one and its subdomains; an extra port only when the
    grant names that port (no port: the default ports 80 and 443, which every rule has)."""
    return grant.covers(rule.name) and (rule.port is None or rule.port == grant.port)


def needs_of(options: RunOptions) -> dict[str, Any]:
    """What of a session's options its grants had to allow (after check()), as JSON: a fork
    or resume of it asks for the same again, checked against its owner's grants of that time.
    Secrets as a flag only: their values are never written down."""
    network = parse_network_request(
        options.get("allow_network", False),
        options.get("allowed_domains"),
        options.get("expose_ports"),
    )
    return {
        "allow_network": bool(network is not None and network.outbound),
        "allowed_domains": None
        if network is None or network.rules is None
        else [_rule_text(r) for r in network.rules],
        "expose": bool(network is not None and network.ports),
        "secrets": bool(options.get("secrets") or options.get("http_headers")),
        "volumes": {
            a.path: {"volume": a.name, "read_only": a.read_only}
            for a in validate_volumes(options.get("volumes"))
        },
    }


def check_needs(grants: Grants | None, needs: Any, who: str) -> None:
    """NotGranted when grants do not cover what needs_of() recorded of a session (a copy has
    its original's network and mounts: a read-write mount of a volume now granted read-only
    is refused, not narrowed). Records without needs (older servers) pass."""
    if grants is None or not isinstance(needs, Mapping):
        return
    options: dict[str, Any] = {
        "allow_network": needs.get("allow_network") is True,
        "allowed_domains": needs.get("allowed_domains"),
    }
    if not options["allow_network"]:
        options["allowed_domains"] = None
    check(grants, options, who)  # type: ignore[arg-type]  # a RunOptions subset
    if needs.get("expose") and not grants.expose:
        raise NotGranted(
            f"token {who!r} may not use or copy a session with expose_ports (no expose grant)"
        )
    if needs.get("secrets") and not grants.secrets:
        raise NotGranted(
            f"token {who!r} may not use or copy a session with secrets (no secrets grant)"
        )
    mounts = needs.get("volumes")
    allowed = dict(grants.volumes)
    for mount in (mounts or {}).values() if isinstance(mounts, Mapping) else ():
        name = mount.get("volume") if isinstance(mount, Mapping) else None
        mode = allowed.get(str(name))
        if mode is None or (mode == READ_ONLY and not mount.get("read_only")):
            how = " read-write" if mode else ""
            raise NotGranted(
                f"token {who!r} may not use or copy a session mounting volume {name!r}{how} "
                "(its volume grants: "
                f"{', '.join(f'{n}:{m}' for n, m in grants.volumes) or 'none'})"
            )
