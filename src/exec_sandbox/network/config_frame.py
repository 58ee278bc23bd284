"""The NET_CONFIG payload (net_protocol.h), sent on the agent channel before user code runs."""

from __future__ import annotations

import ssl
import struct
from pathlib import Path

from .names import extra_ports
from .policy import NetworkPolicy

NET_CONFIG = 104  # SBX_MSG_NET_CONFIG
CONFIG_OUTBOUND = 1
CA_BUNDLE_MAX = 1024 * 1024  # SBX_NET_CA_BUNDLE_MAX
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def _str(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def build_net_config(policy: NetworkPolicy, ca_bundle: bytes) -> bytes:
    """flags, the allowed names ("*" alone: any), the extra ports, the CA bundle."""
    names: list[str] = []
    if policy.outbound:
        names = ["*"] if policy.rules is None else sorted({r.name for r in policy.rules})
    ports = extra_ports(policy.rules) if policy.outbound else []
    out = [struct.pack("<II", CONFIG_OUTBOUND if policy.outbound else 0, len(names))]
    out += [_str(n.encode("ascii")) for n in names]
    out.append(struct.pack("<I", len(ports)))
    out += [struct.pack("<I", port) for port in ports]
    out.append(_str(ca_bundle))
    return b"".join(out)


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
