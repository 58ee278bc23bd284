"""The server's bearer tokens (`sbx token create|list|revoke`).

A token is `sbx_` + 32 random bytes (urlsafe base64), shown once when made. The store keeps its
SHA-256 only, with its name, scope, limits and grants (grants.py), in `tokens.json` of the state
directory (0600, written whole), and the names of revoked tokens: a name is not given to a new
token silently, since what the old token owned is owned by name. The server re-reads the file
when it changed, so a token created or revoked from another shell acts on the next request (and
on the WebSockets it has open), without a restart. A stolen copy of the file gives
no token: the hashes of 256-bit random secrets cannot be reversed or guessed."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from ..errors import InputValidationError
from .grants import Grants
from .statefile import read_json, stamp, write_json

Scope = Literal["run", "admin"]
SCOPES: tuple[Scope, ...] = ("run", "admin")
PREFIX = "sbx_"
# The principal of the Unix socket: whoever can open it (its owner) has every scope.
LOCAL = "local"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A bearer token longer than this is not one of ours: not even hashed.
MAX_TOKEN_LENGTH = 128


@dataclasses.dataclass(frozen=True)
class TokenRecord:
    """What the store keeps of a token (never the token itself)."""

    name: str
    sha256: str
    scope: Scope
    created_at: float
    expires_at: float | None = None  # time.time(); None: never
    max_sessions: int | None = None  # None: the server's default per token
    max_vms: int | None = None
    # What a run token may ask of its VMs; None: everything (admin tokens, and run tokens
    # stored before grants existed, which keep what they had).
    grants: Grants | None = None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def public(self) -> dict[str, Any]:
        """The record without its hash (what `sbx token list --json` shows)."""
        out = self.to_json()
        del out["sha256"]
        return out

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["grants"] = None if self.grants is None else self.grants.to_json()
        return out

    @classmethod
    def from_json(cls, item: Any) -> TokenRecord:
        """KeyError, TypeError or ValueError for a damaged record."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in item.items() if k in fields}
        grants = values.pop("grants", None)
        record = cls(**values)
        if grants is not None:
            record = dataclasses.replace(record, grants=Grants.from_json(grants))
        return record

    def describe_grants(self) -> str:
        """What `sbx token list` shows of the grants."""
        if self.scope == "admin":
            return "unrestricted (admin)"
        if self.grants is None:
            return "legacy: unrestricted"
        return self.grants.describe()


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request comes from: a token's name (`local` on the Unix socket), its scopes, and
    its own limits (None: the server's defaults), its grants (None: everything) and the hash of
    its token (None on the Unix socket): what tells a WebSocket that its token was revoked."""

    name: str
    scopes: frozenset[str]
    max_sessions: int | None = None
    max_vms: int | None = None
    grants: Grants | None = None
    sha256: str | None = None

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


LOCAL_PRINCIPAL = Principal(LOCAL, frozenset(SCOPES))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def principal_of(record: TokenRecord) -> Principal:
    if record.scope == "admin":
        return Principal(
            record.name, frozenset(SCOPES), record.max_sessions, record.max_vms, None, record.sha256
        )
    return Principal(
        record.name,
        frozenset({"run"}),
        record.max_sessions,
        record.max_vms,
        record.grants,
        record.sha256,
    )


class TokenStore:
    """tokens.json of a state directory. Thread-safe: the server looks tokens up from its
    event loop (a stat per request; a re-read only when the file changed)."""

    FILE = "tokens.json"

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / self.FILE
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, TokenRecord] = {}

    # --- the commands (`sbx token ...`) ---

    def create(
        self,
        name: str,
        *,
        scope: str = "run",
        expires_in_days: float | None = None,
        max_sessions: int | None = None,
        max_vms: int | None = None,
        grants: Grants | None = None,
        reuse_name: bool = False,
    ) -> str:
        """A new token (returned once; only its hash is stored). InputValidationError for a bad
        name, scope or limit, a name in use, or a revoked token's name unless reuse_name (the
        new token then owns what the old one left). grants: a run token's (None: none at all,
        Grants()); an admin token has every one."""
        if not _NAME.fullmatch(name) or name == LOCAL:
            raise InputValidationError(
                f"token name {name!r}: 1-64 of A-Z a-z 0-9 . _ - (not {LOCAL!r})"
            )
        if scope not in SCOPES:
            raise InputValidationError(f"scope must be one of {', '.join(SCOPES)}")
        for label, limit in (("max_sessions", max_sessions), ("max_vms", max_vms)):
            if limit is not None and limit < 0:
                raise InputValidationError(f"{label} must be >= 0")
        if expires_in_days is not None and expires_in_days <= 0:
            raise InputValidationError("expires_in_days must be > 0")
        token = PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        record = TokenRecord(
            name=name,
            sha256=hash_token(token),
            scope=scope,  # checked against SCOPES above
            created_at=now,
            expires_at=None if expires_in_days is None else now + expires_in_days * 86400,
            max_sessions=max_sessions,
            max_vms=max_vms,
            grants=None if scope == "admin" else (grants or Grants()),
        )
        with self._locked():
            records = self._read()
            if any(r.name == name for r in records):
                raise InputValidationError(f"a token named {name!r} exists (revoke it first)")
            revoked = self._revoked_names()
            if name in revoked and not reuse_name:
                raise InputValidationError(
                    f"{name!r} is a revoked token's name: a token of that name owns what it "
                    "left (sessions, paused sessions, shares naming it); use another name, or "
                    "--reuse-name to mean it"
                )
            self._write([*records, record], [n for n in revoked if n != name])
        return token

    def records(self) -> list[TokenRecord]:
        return sorted(self._read(), key=lambda r: r.created_at)

    def revoked_names(self) -> list[str]:
        return list(self._revoked_names())

    def revoke(self, name: str) -> bool:
        """Forget the token of that name (its name is kept as revoked); False when there was
        none."""
        with self._locked():
            records = self._read()
            kept = [r for r in records if r.name != name]
            if len(kept) == len(records):
                return False
            revoked = self._revoked_names()
            self._write(kept, [*revoked, name] if name not in revoked else revoked)
        return True

    # --- the server ---

    def lookup(self, token: str) -> TokenRecord | None:
        """The record of a presented token (expired ones included: the caller says why it
        refuses), None for an unknown one."""
        if not token.startswith(PREFIX) or len(token) > MAX_TOKEN_LENGTH:
            return None
        with self._lock:
            current = stamp(self.path)
            if current != self._stamp:
                self._by_hash = {r.sha256: r for r in self._read()}
                self._stamp = current
            return self._by_hash.get(hash_token(token))

    def still_valid(self, sha256: str) -> bool:
        """Whether the token of that hash is in the file and not expired (what an open
        WebSocket checks: a stat, a re-read only when the file changed)."""
        with self._lock:
            current = stamp(self.path)
            if current != self._stamp:
                self._by_hash = {r.sha256: r for r in self._read()}
                self._stamp = current
            record = self._by_hash.get(sha256)
        return record is not None and not record.expired()

    # --- the file ---

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Read-modify-write of the file by one `sbx token` process at a time."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.path.with_name(self.FILE + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _read(self) -> list[TokenRecord]:
        data = read_json(self.path)
        if data is None:
            return []
        try:
            return [TokenRecord.from_json(item) for item in data["tokens"]]
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"{self.path} is damaged: {exc}") from None

    def _revoked_names(self) -> list[str]:
        data = read_json(self.path)
        names = data.get("revoked", []) if isinstance(data, dict) else []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{self.path} is damaged: revoked is not a list of names")
        return names

    def _write(self, records: list[TokenRecord], revoked: list[str]) -> None:
        write_json(
            self.path,
            {"tokens": [r.to_json() for r in records], "revoked": revoked},
        )
