"""`allowed_domains`: parsing the caller's entries and matching the names a guest asks for.

An entry is a DNS name ("api.github.com", IDNA names accepted and stored as their ASCII form) or
"name:port" (the same name, one more port besides 80 and 443). A rule allows its name and every
subdomain at a label boundary: "github.com" allows "api.github.com", never "xgithub.com". Bad
entries raise NetworkValidationError before any VM starts."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import InputValidationError
from ..vm.binding import NET_EXTRA_PORTS_MAX as EXTRA_PORTS_MAX
from ..vm.binding import NET_NAME_MAX as NAME_MAX
from ..vm.binding import NET_NAMES_MAX as NAMES_MAX

DEFAULT_PORTS = (80, 443)
LABEL_MAX = 63
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


class NetworkValidationError(InputValidationError):
    """allow_network / allowed_domains / expose_ports were given a value that cannot work."""


@dataclass(frozen=True)
class DomainRule:
    """One allowed_domains entry: `name` (ASCII, lowercase) and its subdomains; `port` None means
    the default ports (80, 443), else that port too."""

    name: str
    port: int | None = None

    def covers(self, name: str) -> bool:
        return name == self.name or name.endswith("." + self.name)


def ascii_name(name: str) -> str:
    """The ASCII (IDNA) lowercase form of a DNS name, or NetworkValidationError saying why not."""
    if not isinstance(name, str):
        raise NetworkValidationError(f"a domain must be a str, got {type(name).__name__}")
    if name.endswith(".") and not name.endswith(".."):
        name = name[:-1]
    if not name:
        raise NetworkValidationError("a domain is empty")
    if "://" in name or "/" in name:
        raise NetworkValidationError(
            f"{name!r} looks like a URL: give the host name only (e.g. 'example.org')"
        )
    if "*" in name:
        raise NetworkValidationError(
            f"{name!r}: wildcards are not supported; a name already allows its subdomains, "
            "and allowed_domains=None with allow_network=True allows every public name"
        )
    if any(c.isspace() for c in name):
        raise NetworkValidationError(f"{name!r} contains white space")
    labels = name.split(".")
    out = []
    for label in labels:
        if not label:
            raise NetworkValidationError(f"{name!r} has an empty label")
        if not label.isascii():
            try:
                label = label.encode("idna").decode("ascii")
            except UnicodeError as exc:
                raise NetworkValidationError(f"{name!r} is not a valid IDNA name: {exc}") from None
        label = label.lower()
        if len(label) > LABEL_MAX:
            raise NetworkValidationError(
                f"{name!r} has a label of {len(label)} characters (at most {LABEL_MAX})"
            )
        if not set(label) <= _LABEL_CHARS or label.startswith("-") or label.endswith("-"):
            raise NetworkValidationError(f"{name!r}: labels are letters, digits and inner hyphens")
        out.append(label)
    result = ".".join(out)
    if len(result) > NAME_MAX:
        raise NetworkValidationError(f"{name!r} is longer than {NAME_MAX} characters")
    if is_address_literal(result):
        raise NetworkValidationError(f"{name!r} is an IP address, not a name")
    return result


def is_address_literal(name: str) -> bool:
    """True for anything the C library would take as an address rather than a name: dotted
    quads, but also "127.1", "2130706433" or "0x7f000001" (inet_aton's forms)."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(name)
        return True
    except OSError:
        return False


def parse_allowed_domains(entries: Sequence[str] | None) -> tuple[DomainRule, ...] | None:
    """None stays None (every public name); a list becomes rules, validated."""
    if entries is None:
        return None
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
        raise NetworkValidationError("allowed_domains must be a list of names, not a single str")
    rules: list[DomainRule] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise NetworkValidationError(
                f"allowed_domains entries must be str, got {type(entry).__name__}"
            )
        name, port = entry, None
        if ":" in entry and "://" not in entry:
            name, _, port_text = entry.rpartition(":")
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise NetworkValidationError(
                    f"{entry!r}: the port after ':' must be a number in 1..65535"
                )
            port = int(port_text)
        rule = DomainRule(ascii_name(name), port)
        if rule not in rules:
            rules.append(rule)
    names = {r.name for r in rules}
    if len(names) > NAMES_MAX:
        raise NetworkValidationError(
            f"allowed_domains has {len(names)} names (at most {NAMES_MAX})"
        )
    if len(extra_ports(rules)) > EXTRA_PORTS_MAX:
        raise NetworkValidationError(
            f"allowed_domains opens more than {EXTRA_PORTS_MAX} ports besides 80 and 443"
        )
    return tuple(rules)


def extra_ports(rules: Iterable[DomainRule] | None) -> list[int]:
    """Ports besides 80 and 443 the rules open (the guest's agent listens on them too)."""
    if rules is None:
        return []
    return sorted({r.port for r in rules if r.port is not None and r.port not in DEFAULT_PORTS})


def check_name(rules: tuple[DomainRule, ...] | None, name: str, port: int) -> str | None:
    """None when (name, port) is allowed by the rules, else why not. `name` comes from the guest
    (already ASCII lowercase, checked by the C decoder) and is re-checked here."""
    try:
        canonical = ascii_name(name)
    except NetworkValidationError as exc:
        return str(exc)
    if canonical != name:
        return f"{name!r} is not in canonical form"
    if rules is None:
        if "." not in name:
            return f"{name!r} is not a fully qualified name"
        if port not in DEFAULT_PORTS:
            return f"port {port} is not allowed (80 and 443 only without allowed_domains)"
        return None
    covering = [r for r in rules if r.covers(name)]
    if not covering:
        return f"{name!r} is not in allowed_domains"
    if port in DEFAULT_PORTS or any(r.port == port for r in covering):
        return None
    return f"port {port} is not allowed for {name!r}"
