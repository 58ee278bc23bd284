"""What NET_CONFIG (net_protocol.h) tells the guest, sent on the agent channel before user code
runs; the C core encodes it (GuestVm.send_net_config)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import NamedTuple

from ..vm.binding import NET_CA_BUNDLE_MAX as CA_BUNDLE_MAX
from .names import extra_ports
from .policy import NetworkPolicy

_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


class NetConfig(NamedTuple):
    outbound: bool
    names: list[str]
    ports: list[int]
    ca_bundle: bytes


def build_net_config(policy: NetworkPolicy, ca_bundle: bytes) -> NetConfig:
    """outbound, the allowed names ("*" alone: any), the extra ports, the CA bundle."""
    names: list[str] = []
    if policy.outbound:
        names = ["*"] if policy.rules is None else sorted({r.name for r in policy.rules})
    ports = extra_ports(policy.rules) if policy.outbound else []
    return NetConfig(policy.outbound, names, ports, ca_bundle)


def system_ca_bundle_path() -> Path | None:
    """The host's CA bundle (what its own clients trust, an intercepting proxy's CA included)."""
    cafile = ssl.get_default_verify_paths().cafile
    for candidate in (cafile, *_SYSTEM_BUNDLES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def read_ca_bundle(path: Path | None) -> bytes:
    """The bundle's PEM bytes (b"" when there is none: the guest keeps its image's)."""
    if path is None:
        return b""
    data = path.read_bytes()
    if len(data) > CA_BUNDLE_MAX:
        raise ValueError(f"the CA bundle {path} is larger than {CA_BUNDLE_MAX} bytes")
    return data
