"""The addresses a guest's stream may never reach, whatever name led to them.

Checked on every address the host's resolver returns, before connecting. Not `not is_global`:
some package indexes (this project's CI among them) answer from documentation ranges, which are
not global yet are real peers. The list is explicit instead: loopback, RFC 1918, link-local
(with the cloud metadata address 169.254.169.254), CGNAT, multicast, unspecified, broadcast and
reserved, the synthetic range the guest's DNS stub answers with, and the IPv6 forms of all of
them (IPv4-mapped and -compatible addresses are checked as the IPv4 address they carry; NAT64 and
6to4 prefixes, which can carry any IPv4 address, are denied whole). The addresses of this host's
own interfaces are denied too (a name that resolves to the host's LAN address reaches its
services as well as 127.0.0.1 does).

`private_ok` (SchedulerConfig.network_allow_private_ranges, an operator's choice) opens RFC 1918,
CGNAT and IPv6 ULA; never loopback, link-local, the host's own addresses or the rest."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4_DENIED = [
    ("0.0.0.0/8", "unspecified"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("198.18.0.0/15", "benchmarking / the guest's synthetic range"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved / broadcast"),
]
_V4_PRIVATE = [
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT"),
]
_V6_DENIED = [
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "NAT64 (local use)"),
    ("2002::/16", "6to4"),
    ("100::/64", "discard"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
]
_V6_PRIVATE = [("fc00::/7", "unique local (ULA)")]


def _nets(
    table: list[tuple[str, str]],
) -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]]:
    return [(ipaddress.ip_network(net), why) for net, why in table]


_DENIED = _nets(_V4_DENIED) + _nets(_V6_DENIED)
_PRIVATE = _nets(_V4_PRIVATE) + _nets(_V6_PRIVATE)


def denied_reason(
    address: str | IPAddress, *, private_ok: bool = False, local: frozenset[IPAddress] | None = None
) -> str | None:
    """None when a stream may connect to `address`, else which range forbids it."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "scoped IPv6 address"
        embedded = ip.ipv4_mapped or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
            if int(ip) >> 32 == 0 and int(ip) > 1
            else None
        )
        if embedded is not None:
            why = denied_reason(embedded, private_ok=private_ok, local=local)
            return None if why is None else f"IPv4-mapped {why}"
    for net, why in _DENIED if private_ok else _DENIED + _PRIVATE:
        if ip.version == net.version and ip in net:
            return why
    if ip in (local if local is not None else host_addresses()):
        return "an address of this host"
    return None


@lru_cache(maxsize=1)
def host_addresses() -> frozenset[IPAddress]:
    """This host's interface addresses (read once: /proc/net/fib_trie's LOCAL entries for IPv4,
    /proc/net/if_inet6 for IPv6). Empty when /proc cannot tell."""
    found: set[IPAddress] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii") as f:
            last = None
            for line in f:
                parts = line.split()
                if parts[:1] == ["|--"] and len(parts) == 2:
                    last = parts[1]
                elif last and "/32 host LOCAL" in line:
                    found.add(ipaddress.IPv4Address(last))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as f:
            for line in f:
                raw = line.split()[0]
                found.add(ipaddress.IPv6Address(int(raw, 16)))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)
