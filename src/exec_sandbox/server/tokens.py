"""The server's bearer tokens (`sbx token create|list|revoke`).

A token is `sbx_` + 32 random bytes (urlsafe base64), shown once when made. The store keeps its
SHA-256 only, with its name, scope and limits, in `tokens.json` of the state directory (0600,
written whole). The server re-reads the file when it changed, so a token created or revoked
from another shell acts on the next request, without a restart. A stolen copy of the file gives
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

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def public(self) -> dict[str, Any]:
        """The record without its hash (what `sbx token list --json` shows)."""
        out = dataclasses.asdict(self)
        del out["sha256"]
        return out


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request comes from: a token's name (`local` on the Unix socket), its scopes, and
    its own limits (None: the server's defaults)."""

    name: str
    scopes: frozenset[str]
    max_sessions: int | None = None
    max_vms: int | None = None

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


LOCAL_PRINCIPAL = Principal(LOCAL, frozenset(SCOPES))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def principal_of(record: TokenRecord) -> Principal:
    scopes = frozenset(SCOPES) if record.scope == "admin" else frozenset({"run"})
    return Principal(record.name, scopes, record.max_sessions, record.max_vms)


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
    ) -> str:
        """A new token (returned once; only its hash is stored). InputValidationError for a bad
        name, scope or limit, or a name in use."""
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
        )
        with self._locked():
            records = self._read()
            if any(r.name == name for r in records):
                raise InputValidationError(f"a token named {name!r} exists (revoke it first)")
            self._write([*records, record])
        return token

    def records(self) -> list[TokenRecord]:
        return sorted(self._read(), key=lambda r: r.created_at)

    def revoke(self, name: str) -> bool:
        """Forget the token of that name; False when there was none."""
        with self._locked():
            records = self._read()
            kept = [r for r in records if r.name != name]
            if len(kept) == len(records):
                return False
            self._write(kept)
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
        fields = {f.name for f in dataclasses.fields(TokenRecord)}
        try:
            return [
                TokenRecord(**{k: v for k, v in item.items() if k in fields})
                for item in data["tokens"]
            ]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{self.path} is damaged: {exc}") from None

    def _write(self, records: list[TokenRecord]) -> None:
        write_json(self.path, {"tokens": [dataclasses.asdict(r) for r in records]})
