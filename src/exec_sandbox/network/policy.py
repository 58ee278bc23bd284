"""What one VM's network may do, and the host-side half of an outbound stream: check the name,
resolve it off the loop, check every address, connect to a checked address (never resolving
again), with a timeout. A refusal carries the status and reason NET_OPENED sends back."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from .addresses import denied_reason
from .names import DomainRule, check_name

# net_protocol.h: enum sbx_net_status
OK = 0
REFUSED_POLICY = 1
REFUSED_ADDRESS = 2
RESOLVE_FAILED = 3
CONNECT_FAILED = 4
TOO_MANY = 5

RESOLVE_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 10.0


class Refused(Exception):
    """An outbound stream the host will not (or could not) open."""

    def __init__(self, status: int, reason: str, addresses: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.addresses = addresses


@dataclass(frozen=True)
class NetworkPolicy:
    """outbound: allow_network; rules: allowed_domains (None: every public name);
    private_ok: SchedulerConfig.network_allow_private_ranges; test_hosts:
    SchedulerConfig.network_test_hosts (tests only, see config.py)."""

    outbound: bool
    rules: tuple[DomainRule, ...] | None = None
    private_ok: bool = False
    test_hosts: Mapping[str, str] = field(default_factory=dict)

    def check(self, name: str, port: int) -> str | None:
        """Why (name, port) is refused by policy alone, or None."""
        if not self.outbound:
            return "network access is off for this VM (allow_network=False)"
        return check_name(self.rules, name, port)


def _test_target(policy: NetworkPolicy, name: str, port: int) -> tuple[str, int] | None:
    """Where the test hook sends name:port, if it knows the name."""
    target = policy.test_hosts.get(f"{name}:{port}") or policy.test_hosts.get(name)
    if target is None:
        return None
    host, sep, port_text = target.rpartition(":")
    if sep and port_text.isdigit() and not target.endswith("]"):
        return host.strip("[]"), int(port_text)
    return target.strip("[]"), port


async def resolve(policy: NetworkPolicy, name: str, port: int) -> list[tuple[str, int]]:
    """Checked (address, port) pairs for name:port, in the resolver's order. Refused otherwise.

    Resolution runs in the loop's executor (getaddrinfo blocks). Every address must pass the
    deny list: one denied answer refuses the name (a name that mixes a public and a private
    answer is not one to trust)."""
    test = _test_target(policy, name, port)
    if test is not None:
        return [test]  # the test hook's own servers: the one thing it marks allowed
    loop = asyncio.get_running_loop()
    try:
        # asyncio.timeout, not wait_for: on 3.11 wait_for wraps the awaitable in a task of its
        # own, loop iterations that every connection's first byte waits for.
        async with asyncio.timeout(RESOLVE_TIMEOUT_SECONDS):
            infos = await loop.getaddrinfo(
                name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
    except TimeoutError:
        raise Refused(RESOLVE_FAILED, f"resolving {name} timed out") from None
    except (OSError, UnicodeError) as exc:
        raise Refused(RESOLVE_FAILED, f"cannot resolve {name}: {exc}") from None
    targets: list[tuple[str, int]] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        address = str(sockaddr[0])
        if (address, port) not in targets:
            targets.append((address, port))
    addresses = tuple(a for a, _ in targets)
    if not targets:
        raise Refused(RESOLVE_FAILED, f"{name} has no address")
    for address in addresses:
        why = denied_reason(address, private_ok=policy.private_ok)
        if why is not None:
            raise Refused(REFUSED_ADDRESS, f"{name} resolves to {address} ({why})", addresses)
    return targets


async def connect(targets: list[tuple[str, int]], name: str) -> socket.socket:
    """A socket connected to the first target that answers (each already checked), or Refused.
    The whole attempt shares one timeout."""
    loop = asyncio.get_running_loop()
    errors = []
    deadline = loop.time() + CONNECT_TIMEOUT_SECONDS
    for address, port in targets:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("timed out")
            async with asyncio.timeout(remaining):  # see resolve(): no task of its own
                await loop.sock_connect(sock, (address, port))
        except OSError as exc:  # TimeoutError included
            sock.close()
            errors.append(f"{address}: {exc or 'timed out'}")
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise Refused(
        CONNECT_FAILED,
        f"cannot connect to {name}:{targets[0][1]}: " + "; ".join(errors),
        tuple(a for a, _ in targets),
    )
