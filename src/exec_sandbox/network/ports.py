"""expose_ports: validating the caller's list and binding the host's listeners (127.0.0.1 only)
before any VM starts, so that a busy port is an error the caller sees at once."""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

from ..models import ExposedPort, PortMapping
from .names import NetworkValidationError

EXPOSED_PORTS_MAX = 10  # SBX_NET_EXPOSED_PORTS_MAX, the public limit
LISTEN_HOST = "127.0.0.1"


def _port(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise NetworkValidationError(f"{what} must be a port number in 1..65535, got {value!r}")
    return value


def parse_expose_ports(ports: Sequence[int | PortMapping] | None) -> tuple[PortMapping, ...]:
    """The caller's expose_ports as PortMappings, validated (NetworkValidationError)."""
    if ports is None:
        return ()
    if isinstance(ports, (int, PortMapping)) or not isinstance(ports, Sequence):
        raise NetworkValidationError("expose_ports must be a list of ports or PortMappings")
    if len(ports) > EXPOSED_PORTS_MAX:
        raise NetworkValidationError(
            f"expose_ports has {len(ports)} entries (at most {EXPOSED_PORTS_MAX})"
        )
    out: list[PortMapping] = []
    for entry in ports:
        if isinstance(entry, PortMapping):
            mapping = PortMapping(
                _port(entry.internal, "PortMapping.internal"),
                None if entry.external is None else _port(entry.external, "PortMapping.external"),
                entry.protocol,
            )
            if mapping.protocol != "tcp":
                raise NetworkValidationError(
                    f"PortMapping.protocol {mapping.protocol!r}: only 'tcp' is supported"
                )
        else:
            mapping = PortMapping(_port(entry, "an exposed port"))
        if any(m.internal == mapping.internal for m in out):
            raise NetworkValidationError(f"guest port {mapping.internal} is exposed twice")
        if mapping.external is not None and any(m.external == mapping.external for m in out):
            raise NetworkValidationError(f"host port {mapping.external} is used twice")
        out.append(mapping)
    return tuple(out)


def bind_listeners(mappings: Sequence[PortMapping]) -> list[tuple[socket.socket, ExposedPort]]:
    """Listening sockets on 127.0.0.1 (non-blocking), one per mapping; the caller owns them.
    NetworkValidationError when a requested host port is busy (nothing stays bound then)."""
    bound: list[tuple[socket.socket, ExposedPort]] = []
    try:
        for mapping in mappings:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((LISTEN_HOST, mapping.external or 0))
                sock.listen(64)
                sock.setblocking(False)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE:
                    raise NetworkValidationError(
                        f"host port {mapping.external} is already in use (expose guest port "
                        f"{mapping.internal} on another port, or on None for a free one)"
                    ) from None
                raise
            external = sock.getsockname()[1]
            bound.append(
                (sock, ExposedPort(mapping.internal, external, LISTEN_HOST, mapping.protocol))
            )
    except BaseException:
        for sock, _ in bound:
            sock.close()
        raise
    return bound
