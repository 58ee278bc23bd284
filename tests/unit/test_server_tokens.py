"""The token store of `sbx serve` (server/tokens.py), no VM: only hashes on disk, a private
file written whole, expiry, revocation seen by a running server without a restart."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pytest

from exec_sandbox.errors import InputValidationError
from exec_sandbox.server.tokens import PREFIX, TokenStore, principal_of


def test_token_is_random_and_only_its_hash_is_stored(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token = store.create("agent")
    other = store.create("agent2")
    assert token.startswith(PREFIX) and token != other
    assert len(token) >= len(PREFIX) + 43  # 32 bytes, urlsafe base64
    text = (tmp_path / "tokens.json").read_text()
    assert token not in text and token[len(PREFIX) :] not in text
    assert hashlib.sha256(token.encode()).hexdigest() in text


def test_store_file_is_private(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    store.create("a")
    mode = stat.S_IMODE(os.stat(tmp_path / "state" / "tokens.json").st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700


def test_lookup_finds_the_record_and_scope(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token = store.create("ops", scope="admin", max_sessions=2, max_vms=3)
    record = store.lookup(token)
    assert record is not None and record.name == "ops"
    principal = principal_of(record)
    assert principal.admin and principal.max_sessions == 2 and principal.max_vms == 3
    run_only = principal_of(store.lookup(store.create("bot")))  # type: ignore[arg-type]
    assert not run_only.admin and run_only.scopes == {"run"}
    assert store.lookup(token + "x") is None
    assert store.lookup("not-a-token") is None


def test_expired_token_is_reported_expired(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token = store.create("short", expires_in_days=1e-9)
    time.sleep(0.01)
    record = store.lookup(token)
    assert record is not None and record.expired()
    fresh = store.lookup(store.create("long", expires_in_days=1))
    assert fresh is not None and not fresh.expired()


def test_revoke_and_create_are_seen_by_a_running_lookup(tmp_path: Path) -> None:
    server_view = TokenStore(tmp_path)
    token = TokenStore(tmp_path).create("a")
    assert server_view.lookup(token) is not None
    assert TokenStore(tmp_path).revoke("a")
    assert server_view.lookup(token) is None
    later = TokenStore(tmp_path).create("b")
    assert server_view.lookup(later) is not None
    assert not TokenStore(tmp_path).revoke("a")


@pytest.mark.parametrize("name", ["", "local", "a b", "x" * 65, "../x"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputValidationError):
        TokenStore(tmp_path).create(name)


def test_duplicate_name_and_bad_scope_are_refused(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    store.create("a")
    with pytest.raises(InputValidationError):
        store.create("a")
    with pytest.raises(InputValidationError):
        store.create("b", scope="root")
    assert [r.name for r in store.records()] == ["a"]


def test_public_record_has_no_hash(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    store.create("a")
    assert "sha256" not in json.dumps(store.records()[0].public())
