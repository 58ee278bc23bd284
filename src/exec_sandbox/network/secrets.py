"""Secrets that never enter the VM: `Secret` (a value bound to the hosts that may receive it) and
`http_headers` (headers the host adds for a host), validated before any VM starts, and what the
interception (intercept.py) does with them for one VM.

In the guest a secret's environment variable holds a random placeholder, new for every VM. Only
on the host, and only in requests to the secret's own hosts, is the placeholder replaced by the
value, and only where a server takes a credential rather than reflects input: in the headers
that carry credentials (Authorization and Proxy-Authorization, also inside Basic credentials, and
the usual API-key headers; a secret may name its own, `headers=`), and in one named body field
for a secret that says so (`replace_in_body="api_key"`: a top-level JSON member or form field
whose whole value is the placeholder). A placeholder sent anywhere else, or in any other header
or body text (an Origin header, a prompt, an issue title: what a server may echo back), goes out
as it is: leaking it leaks nothing."""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets as _random
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .names import DomainRule, NetworkValidationError, ascii_name, check_name

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 token characters: what a header name may be.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
VALUE_MAX = 16 * 1024  # a header value h11 still takes (its head limit is larger)
SECRETS_MAX = 64
HEADER_RULES_MAX = 64
PLACEHOLDER_PREFIX = "sbx-secret-"
# Headers the interception owns (framing and routing): a rule may not set them.
_RESERVED = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade"})
# Where a secret's placeholder is replaced unless the secret names its own headers: the headers
# servers take credentials from, which they do not echo (unlike Origin, X-Request-Id, ...).
CREDENTIAL_HEADERS = (
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "private-token",
    "x-goog-api-key",
)
_BASIC_HEADERS = (b"authorization", b"proxy-authorization")


@dataclass(frozen=True)
class Secret:
    """A value the VM's code may use without seeing it: `name` is the environment variable that
    holds a placeholder in the guest, `hosts` the names ("api.example.com", or "name:port" for
    plain HTTP on that port) whose requests get the real value in place of the placeholder: in
    the credential headers (CREDENTIAL_HEADERS, or `headers`, this secret's own list), and with
    replace_in_body="field" in that top-level JSON member or form field of a request body when
    its whole value is the placeholder (such a body is read whole first, at most 1 MiB).
    repr() never shows the value."""

    name: str
    value: str = field(repr=False)
    hosts: Sequence[str] = ()
    headers: Sequence[str] | None = None
    replace_in_body: str | None = None

    def __repr__(self) -> str:  # the dataclass repr would be fine; this says it on purpose
        extra = "" if self.headers is None else f", headers={list(self.headers)!r}"
        if self.replace_in_body is not None:
            extra += f", replace_in_body={self.replace_in_body!r}"
        return f"Secret(name={self.name!r}, value=<hidden>, hosts={list(self.hosts)!r}{extra})"


@dataclass(frozen=True)
class SecretHost:
    """A host a secret or header rule is for: a name and a port (None: 80 plain, 443 TLS)."""

    name: str
    port: int | None = None

    def matches(self, name: str, port: int) -> bool:
        if name != self.name:
            return False
        return port in (80, 443) if self.port is None else port == self.port

    def __str__(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"


@dataclass(frozen=True)
class BoundSecret:
    """A validated secret with its hosts; `placeholder` is empty until bound to one VM."""

    name: str
    value: str = field(repr=False)
    hosts: tuple[SecretHost, ...]
    placeholder: str = ""
    headers: tuple[str, ...] = CREDENTIAL_HEADERS  # lower-case names
    body_field: str | None = None


@dataclass(frozen=True)
class HeaderRule:
    """http_headers[host]: headers set (added or replaced) on every request to host."""

    host: SecretHost
    headers: tuple[tuple[str, str], ...] = field(repr=False)


def _parse_host(entry: object, what: str) -> SecretHost:
    if not isinstance(entry, str):
        raise NetworkValidationError(f"{what}: a host must be a str, got {type(entry).__name__}")
    name, port = entry, None
    if ":" in entry and "://" not in entry:
        name, _, port_text = entry.rpartition(":")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise NetworkValidationError(f"{what}: {entry!r}: the port must be in 1..65535")
        port = int(port_text)
    return SecretHost(ascii_name(name), port)


def _check_allowed(host: SecretHost, rules: tuple[DomainRule, ...] | None, what: str) -> None:
    for port in (80, 443) if host.port is None else (host.port,):
        why = check_name(rules, host.name, port)
        if why is not None:
            raise NetworkValidationError(
                f"{what}: host {str(host)!r} is not allowed ({why}); add it to allowed_domains"
            )


def _check_value(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise NetworkValidationError(f"{what}: the value must be a str, got {type(value).__name__}")
    if not value:
        raise NetworkValidationError(f"{what}: the value is empty")
    if len(value) > VALUE_MAX:
        raise NetworkValidationError(f"{what}: the value is longer than {VALUE_MAX} characters")
    if any(c in value for c in "\r\n\0"):
        raise NetworkValidationError(f"{what}: the value contains CR, LF or NUL")
    if value != value.strip():
        raise NetworkValidationError(f"{what}: the value starts or ends with white space")
    if not value.isascii() or not value.isprintable():
        raise NetworkValidationError(f"{what}: the value must be printable ASCII (a header)")
    return value


def _check_headers(headers: object, what: str) -> tuple[str, ...]:
    if headers is None:
        return CREDENTIAL_HEADERS
    if isinstance(headers, str) or not isinstance(headers, Iterable):
        raise NetworkValidationError(f"{what}: headers must be a list of header names")
    names = []
    for header in headers:
        if not isinstance(header, str) or not _TOKEN.fullmatch(header):
            raise NetworkValidationError(f"{what}: {header!r} is not a header name")
        if header.lower() in _RESERVED:
            raise NetworkValidationError(f"{what}: {header!r} cannot carry a secret")
        names.append(header.lower())
    if not names:
        raise NetworkValidationError(f"{what}: headers is empty")
    return tuple(dict.fromkeys(names))


def _check_body_field(field_name: object, what: str) -> str | None:
    if field_name is None:
        return None
    if not isinstance(field_name, str) or not field_name or len(field_name) > 128:
        raise NetworkValidationError(
            f"{what}: replace_in_body names the body field that holds the key (1..128 characters)"
        )
    return field_name


def parse_secrets(
    secrets: Sequence[Secret] | None,
    http_headers: Mapping[str, Mapping[str, str]] | None,
    *,
    outbound: bool,
    rules: tuple[DomainRule, ...] | None,
) -> tuple[tuple[BoundSecret, ...], tuple[HeaderRule, ...]]:
    """The call's secrets and header rules, validated (NetworkValidationError, naming the secret
    but never its value): valid env var names, each once, non-empty values, hosts allowed."""
    if (secrets or http_headers) and not outbound:
        raise NetworkValidationError("secrets and http_headers need allow_network=True")
    bound: list[BoundSecret] = []
    if secrets is not None:
        if isinstance(secrets, (str, bytes, Secret)) or not isinstance(secrets, Iterable):
            raise NetworkValidationError("secrets must be a list of Secret")
        for secret in secrets:
            if not isinstance(secret, Secret):
                raise NetworkValidationError(
                    f"secrets entries must be Secret, got {type(secret).__name__}"
                )
            name = secret.name
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name) or len(name) > 128:
                raise NetworkValidationError(
                    f"secret name {name!r} is not a valid environment variable name"
                )
            what = f"secret {name}"
            if any(b.name == name for b in bound):
                raise NetworkValidationError(f"{what} is given twice")
            value = _check_value(secret.value, what)
            if isinstance(secret.hosts, str) or not isinstance(secret.hosts, Iterable):
                raise NetworkValidationError(f"{what}: hosts must be a list of names")
            hosts = tuple(dict.fromkeys(_parse_host(h, what) for h in secret.hosts))
            if not hosts:
                raise NetworkValidationError(f"{what}: hosts is empty (where may it be sent?)")
            for host in hosts:
                _check_allowed(host, rules, what)
            bound.append(
                BoundSecret(
                    name,
                    value,
                    hosts,
                    headers=_check_headers(secret.headers, what),
                    body_field=_check_body_field(secret.replace_in_body, what),
                )
            )
        if len(bound) > SECRETS_MAX:
            raise NetworkValidationError(f"more than {SECRETS_MAX} secrets")
    header_rules: list[HeaderRule] = []
    if http_headers is not None:
        if not isinstance(http_headers, Mapping):
            raise NetworkValidationError("http_headers must map a host to {header: value}")
        if len(http_headers) > HEADER_RULES_MAX:
            raise NetworkValidationError(f"http_headers has more than {HEADER_RULES_MAX} hosts")
        for entry, headers in http_headers.items():
            host = _parse_host(entry, "http_headers")
            what = f"http_headers[{entry!r}]"
            _check_allowed(host, rules, what)
            if not isinstance(headers, Mapping) or not headers:
                raise NetworkValidationError(f"{what} must be a non-empty {{header: value}}")
            pairs = []
            for header, value in headers.items():
                if not isinstance(header, str) or not _TOKEN.fullmatch(header):
                    raise NetworkValidationError(f"{what}: {header!r} is not a header name")
                if header.lower() in _RESERVED:
                    raise NetworkValidationError(f"{what}: {header!r} cannot be set by a rule")
                pairs.append((header, _check_value(value, f"{what}[{header!r}]")))
            header_rules.append(HeaderRule(host, tuple(pairs)))
    return tuple(bound), tuple(header_rules)


def bind_placeholders(secrets: tuple[BoundSecret, ...]) -> tuple[BoundSecret, ...]:
    """The secrets with a fresh random placeholder each (one VM's)."""
    return tuple(
        BoundSecret(
            s.name,
            s.value,
            s.hosts,
            PLACEHOLDER_PREFIX + _random.token_hex(16),
            s.headers,
            s.body_field,
        )
        for s in secrets
    )


class HostSecrets:
    """What the interception applies to requests to one (name, port): the secrets bound for it
    and the header rules for it. Built per stream from the VM's bound secrets."""

    def __init__(self, secrets: Sequence[BoundSecret], headers: Sequence[tuple[str, str]]) -> None:
        self._secrets = list(secrets)
        self.headers = list(headers)
        # Bodies are read whole and rewritten only when one of this host's secrets says so.
        self.rewrites_bodies = any(s.body_field is not None for s in self._secrets)

    @classmethod
    def for_host(
        cls,
        secrets: Iterable[BoundSecret],
        rules: Iterable[HeaderRule],
        name: str,
        port: int,
    ) -> HostSecrets | None:
        """None: nothing applies, the stream keeps the plain byte relay."""
        mine = [s for s in secrets if s.placeholder and any(h.matches(name, port) for h in s.hosts)]
        headers = [pair for r in rules if r.host.matches(name, port) for pair in r.headers]
        if not mine and not headers:
            return None
        return cls(mine, headers)

    def rewrite(
        self, headers: list[tuple[bytes, bytes]]
    ) -> tuple[list[tuple[bytes, bytes]], set[str]]:
        """The request's headers with placeholders replaced (also inside Basic credentials) and
        the rules applied; with the names of the secrets that were used."""
        used: set[str] = set()
        out: list[tuple[bytes, bytes]] = []
        replaced = {h.lower().encode() for h, _ in self.headers}
        for name, value in headers:
            if name.lower() in replaced:
                continue
            out.append((name, self._substitute(name, value, used)))
        out.extend((h.encode(), v.encode()) for h, v in self.headers)
        return out, used

    def rewrite_body(self, body: bytes, content_type: bytes, used: set[str]) -> bytes:
        """body with each body-field secret's field replaced where its whole value is the
        placeholder: a top-level member of a JSON object, or a form field (used: their names
        added). Anything else in the body stays as it is."""
        fields = {s.body_field: s for s in self._secrets if s.body_field is not None}
        kind = content_type.split(b";", 1)[0].strip().lower()
        if kind == b"application/json" or kind.endswith(b"+json"):
            try:
                document = json.loads(body)
            except (ValueError, RecursionError):
                return body
            if not isinstance(document, dict):
                return body
            changed = False
            for name, secret in fields.items():
                if document.get(name) == secret.placeholder:
                    document[name] = secret.value
                    used.add(secret.name)
                    changed = True
            return json.dumps(document, ensure_ascii=False).encode() if changed else body
        if kind == b"application/x-www-form-urlencoded":
            try:
                pairs = urllib.parse.parse_qsl(
                    body.decode("ascii"), keep_blank_values=True, strict_parsing=True
                )
            except (UnicodeDecodeError, ValueError):
                return body
            changed = False
            for i, (name, value) in enumerate(pairs):
                owner = fields.get(name)
                if owner is not None and value == owner.placeholder:
                    pairs[i] = (name, owner.value)
                    used.add(owner.name)
                    changed = True
            return urllib.parse.urlencode(pairs).encode() if changed else body
        return body

    def _substitute(self, name: bytes, value: bytes, used: set[str]) -> bytes:
        header = name.lower().decode("ascii", "replace")
        for secret in self._secrets:
            placeholder = secret.placeholder.encode()
            if header in secret.headers and placeholder in value:
                value = value.replace(placeholder, secret.value.encode())
                used.add(secret.name)
        if name.lower() in _BASIC_HEADERS:
            scheme, _, credentials = value.partition(b" ")
            if scheme.lower() == b"basic" and credentials:
                value = scheme + b" " + self._substitute_basic(credentials.strip(), header, used)
        return value

    def _substitute_basic(self, credentials: bytes, header: str, used: set[str]) -> bytes:
        """user:password in base64 (git and pip send a token this way)."""
        try:
            decoded = base64.b64decode(credentials, validate=True)
        except (binascii.Error, ValueError):
            return credentials
        changed = decoded
        for secret in self._secrets:
            placeholder = secret.placeholder.encode()
            if header in secret.headers and placeholder in changed:
                changed = changed.replace(placeholder, secret.value.encode())
                used.add(secret.name)
        return credentials if changed == decoded else base64.b64encode(changed)
