"""A token's grants (server/grants.py), no VM: each option refused without its grant and allowed
with it, domains within the granted ones, read-only volume grants forcing read-only mounts, a
copy (fork, resume) of a session checked against what it asked, /mcp within every grant, and
the store: grants kept, legacy records unrestricted, revoked names not reused silently."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from exec_sandbox import wire
from exec_sandbox.errors import InputValidationError
from exec_sandbox.server.grants import (
    SERVED_MCP_OPTIONS,
    Grants,
    NotGranted,
    check,
    check_needs,
    needs_of,
)
from exec_sandbox.server.tokens import TokenStore, principal_of
from exec_sandbox.volumes import VolumeMount

NONE = Grants()


@pytest.mark.parametrize(
    ("options", "grant", "words", "lacking"),
    [
        ({"allow_network": True}, Grants(network=True), "allow_network", "network"),
        (
            {"allow_network": True, "allowed_domains": ["example.com"]},
            Grants(domains=("example.com",)),
            "allowed_domains",
            "domains",
        ),
        ({"expose_ports": [8000]}, Grants(expose=True), "expose_ports", "expose"),
        (
            {"expose_ports": [{"internal": 80, "external": 8080}]},
            Grants(expose=True),
            "expose",
            "expose",
        ),
        (
            {"allow_network": True, "secrets": [{"name": "K", "value": "v", "hosts": ["a.io"]}]},
            Grants(network=True, secrets=True),
            "secrets",
            "secrets",
        ),
        (
            {"allow_network": True, "http_headers": {"a.io": {"X-Key": "v"}}},
            Grants(network=True, secrets=True),
            "http_headers",
            "secrets",
        ),
        (
            {"volumes": {"/mnt/data": "data"}},
            Grants(volumes=(("data", "rw"),)),
            "volume 'data'",
            "volumes",
        ),
    ],
)
def test_each_option_needs_its_grant(
    options: dict[str, Any], grant: Grants, words: str, lacking: str
) -> None:
    decoded = wire.options_from_wire(options)
    without = dataclasses.replace(grant, **{lacking: getattr(NONE, lacking)})
    with pytest.raises(NotGranted, match=words) as refused:
        check(without, decoded, "bot")
    assert "bot" in str(refused.value) and "sbx token create --" in str(refused.value)
    check(grant, decoded, "bot")  # no error
    check(None, decoded, "admin")  # None: everything


def test_domains_must_be_within_the_granted_ones() -> None:
    grants = Grants.make(domains=["Example.COM", "api.test:8443"])
    ok = {"allow_network": True, "allowed_domains": ["example.com", "x.y.example.com."]}
    assert check(grants, ok, "bot") == ok  # type: ignore[arg-type]
    check(grants, {"allow_network": True, "allowed_domains": ["api.test:8443"]}, "bot")
    for refused in (["notexample.com"], ["com"], ["example.com:22"], ["example.org"]):
        with pytest.raises(NotGranted, match="allowed_domains"):
            check(grants, {"allow_network": True, "allowed_domains": refused}, "bot")
    # Every name (no list) needs the network grant itself.
    with pytest.raises(NotGranted, match="without allowed_domains"):
        check(grants, {"allow_network": True}, "bot")
    assert check(Grants(network=True), {"allow_network": True}, "bot")


def test_read_only_grant_forces_read_only_mounts() -> None:
    grants = Grants.make(volumes=["data:ro", "scratch"])
    out = check(
        grants,
        {"volumes": {"/mnt/data": "data", "/mnt/s": VolumeMount("scratch")}},
        "bot",
    )
    assert out["volumes"] == {
        "/mnt/data": VolumeMount("data", read_only=True),
        "/mnt/s": VolumeMount("scratch", read_only=False),
    }


def test_copies_are_checked_against_what_the_session_asked() -> None:
    needs = needs_of(
        {
            "allow_network": True,
            "allowed_domains": ["example.com"],
            "volumes": {"/mnt/d": "data"},
        }
    )
    assert json.loads(json.dumps(needs)) == needs  # kept in snapshots.json
    check_needs(Grants.make(domains=["example.com"], volumes=["data"]), needs, "bot")
    with pytest.raises(NotGranted, match="read-write"):
        check_needs(Grants.make(domains=["example.com"], volumes=["data:ro"]), needs, "bot")
    with pytest.raises(NotGranted, match="allowed_domains"):
        check_needs(Grants.make(volumes=["data"]), needs, "bot")
    secret = needs_of({"expose_ports": [80]})
    with pytest.raises(NotGranted, match="expose_ports"):
        check_needs(NONE, secret, "bot")
    check_needs(NONE, None, "bot")  # a record of an older server


def test_served_mcp_options_are_within_a_token_with_no_grants() -> None:
    assert check(NONE, SERVED_MCP_OPTIONS, "mcp-caller") == SERVED_MCP_OPTIONS


def test_bad_grants_are_refused() -> None:
    with pytest.raises(InputValidationError):
        Grants.make(volumes=["data:rx"])
    with pytest.raises(InputValidationError):
        Grants.make(volumes=["Bad Name"])
    with pytest.raises(InputValidationError):
        Grants.make(domains=["http://x.com/"])


def test_store_keeps_grants_and_new_run_tokens_have_none(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    plain = principal_of(store.lookup(store.create("plain")))  # type: ignore[arg-type]
    assert plain.grants == NONE
    granted = Grants.make(domains=["example.com"], expose=True, volumes=["data:ro"])
    record = store.lookup(store.create("g", grants=granted))
    assert record is not None and principal_of(record).grants == granted
    assert record.describe_grants() == "domains example.com; expose; volumes data:ro"
    admin = principal_of(store.lookup(store.create("root", scope="admin")))  # type: ignore[arg-type]
    assert admin.grants is None


def test_legacy_record_without_grants_is_unrestricted(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token = store.create("old")
    data = json.loads((tmp_path / "tokens.json").read_text())
    for item in data["tokens"]:
        del item["grants"]
    del data["revoked"]
    (tmp_path / "tokens.json").write_text(json.dumps(data))
    record = TokenStore(tmp_path).lookup(token)
    assert record is not None and principal_of(record).grants is None
    assert record.describe_grants() == "legacy: unrestricted"


def test_revoked_name_is_not_reused_silently(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    store.create("worker")
    assert store.revoke("worker")
    assert store.revoked_names() == ["worker"]
    with pytest.raises(InputValidationError, match="--reuse-name"):
        store.create("worker")
    store.create("worker", reuse_name=True)
    assert store.revoked_names() == []
    assert [r.name for r in store.records()] == ["worker"]


def test_still_valid_follows_revocation_and_expiry(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    record = store.lookup(store.create("live"))
    short = store.lookup(store.create("short", expires_in_days=1e-9))
    assert record is not None and short is not None
    assert store.still_valid(record.sha256)
    assert not store.still_valid(short.sha256)
    TokenStore(tmp_path).revoke("live")  # another process's store
    assert not store.still_valid(record.sha256)
