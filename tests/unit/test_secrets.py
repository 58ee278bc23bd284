"""Secrets' validation and header rewriting (network/secrets.py), and a short run of the
interception fuzzer (tests/fuzz/fuzz_intercept.py: a stand-in guest over a socketpair, no VM).
The real-VM tests are tests/integration/network/test_secrets.py."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from exec_sandbox import NetworkValidationError, RunRequest, SchedulerConfig, Secret
from exec_sandbox.errors import InputValidationError
from exec_sandbox.network import intercept
from exec_sandbox.network.request import parse_network_request, request_to_meta
from exec_sandbox.network.secrets import HostSecrets
from tests.fuzz import fuzz_intercept

VALUE = "real-value-123"


def _request(**options: object) -> RunRequest:
    return RunRequest.make(options, SchedulerConfig(), code="pass")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"secrets": [Secret("A", VALUE, ["x.org"])]}, "need allow_network=True"),
        ({"allow_network": True, "allowed_domains": ["y.org"],
          "secrets": [Secret("A", VALUE, ["x.org"])]}, "is not allowed"),
        ({"allow_network": True, "secrets": [Secret("1A", VALUE, ["x.org"])]}, "not a valid"),
        ({"allow_network": True, "secrets": [Secret("A", "", ["x.org"])]}, "value is empty"),
        ({"allow_network": True, "secrets": [Secret("A", VALUE, [])]}, "hosts is empty"),
        ({"allow_network": True, "secrets": [Secret("A", "a\r\nb", ["x.org"])]}, "CR, LF"),
        ({"allow_network": True, "secrets": [Secret("A", VALUE, ["x.org"])] * 2}, "twice"),
        ({"allow_network": True, "secrets": Secret("A", VALUE, ["x.org"])}, "a list of Secret"),
        ({"allow_network": True, "secrets": [Secret("A", VALUE, "x.org")]}, "list of names"),
        ({"allow_network": True, "http_headers": {"x.org": {"Host": "y"}}}, "cannot be set"),
        ({"allow_network": True, "http_headers": {"x.org": {"Bad Name": "y"}}}, "not a header"),
        ({"allow_network": True, "allowed_domains": ["y.org"],
          "http_headers": {"x.org": {"A": "b"}}}, "is not allowed"),
    ],
)  # fmt: skip
def test_bad_secrets_are_refused_before_any_vm(options: dict[str, object], message: str) -> None:
    with pytest.raises(NetworkValidationError, match=message) as info:
        _request(**options)
    assert VALUE not in str(info.value)


def test_secret_clashing_with_env_var() -> None:
    with pytest.raises(InputValidationError, match="both a secret and in env_vars"):
        _request(allow_network=True, env_vars={"A": "x"}, secrets=[Secret("A", VALUE, ["x.org"])])


def test_value_never_in_reprs_or_saved_metadata() -> None:
    secret = Secret("API_KEY", VALUE, ["api.x.org", "x.org:8080"])
    request = _request(
        allow_network=True,
        allowed_domains=["x.org:8080"],
        secrets=[secret],
        http_headers={"x.org": {"X-Key": VALUE}},
    )
    assert VALUE not in repr(secret) and VALUE not in repr(request)
    assert request.network is not None
    assert VALUE not in str(request_to_meta(request.network))
    assert pickle.loads(pickle.dumps(request)) == request  # a cluster's host gets it whole


def test_placeholders_are_fresh_per_vm() -> None:
    network = parse_network_request(True, None, None, [Secret("A", VALUE, ["x.org"])])
    assert network is not None and network.placeholder_env == {}
    first, second = network.bound(), network.bound()
    assert first.placeholder_env["A"] != second.placeholder_env["A"]
    assert first.bound() is first  # a fork keeps its parent's
    assert VALUE not in first.placeholder_env["A"]


def test_rewrite_headers_basic_and_rules() -> None:
    network = parse_network_request(
        True,
        ["x.org", "x.org:8080"],
        None,
        [Secret("A", VALUE, ["x.org"])],
        {"x.org:8080": {"X-Rule": "r"}},
    )
    assert network is not None
    bound = network.bound()
    ph = bound.placeholder_env["A"]
    rules = HostSecrets.for_host(bound.secrets, bound.header_rules, "x.org", 443)
    assert rules is not None
    basic = base64.b64encode(f"git:{ph}".encode())
    headers, used = rules.rewrite(
        [
            (b"Authorization", b"Basic " + basic),
            (b"X-Api-Key", ph.encode()),
            (b"Origin", ph.encode()),  # a header servers echo: left alone
        ]
    )
    assert base64.b64decode(headers[0][1].split()[1]) == f"git:{VALUE}".encode()
    assert headers[1] == (b"X-Api-Key", VALUE.encode())
    assert headers[2] == (b"Origin", ph.encode())
    assert used == {"A"}
    # Not the secret's host (a subdomain, another port): nothing applies.
    assert HostSecrets.for_host(bound.secrets, bound.header_rules, "api.x.org", 443) is None
    only_rule = HostSecrets.for_host(bound.secrets, bound.header_rules, "x.org", 8080)
    assert only_rule is not None
    headers, used = only_rule.rewrite([(b"x-rule", b"guest's"), (b"Auth", ph.encode())])
    assert headers == [(b"Auth", ph.encode()), (b"X-Rule", b"r")] and used == set()


def test_body_replacement_only_in_the_named_field() -> None:
    network = parse_network_request(
        True,
        ["x.org"],
        None,
        [
            Secret("A", VALUE, ["x.org"], replace_in_body="api_key"),
            Secret("B", "other", ["x.org"], headers=["X-Custom"]),
        ],
        None,
    )
    assert network is not None
    bound = network.bound()
    a, b = bound.placeholder_env["A"], bound.placeholder_env["B"]
    rules = HostSecrets.for_host(bound.secrets, bound.header_rules, "x.org", 443)
    assert rules is not None and rules.rewrites_bodies
    used: set[str] = set()
    doc = {"api_key": a, "b": b, "prompt": f"echo {a}", "nested": {"api_key": a}}
    body = rules.rewrite_body(json.dumps(doc).encode(), b"application/json; charset=utf-8", used)
    assert json.loads(body) == {**doc, "api_key": VALUE} and used == {"A"}
    form = rules.rewrite_body(
        f"api_key={a}&text={a}".encode(), b"application/x-www-form-urlencoded", set()
    )
    assert form == f"api_key={VALUE}&text={a}".encode()
    assert (
        rules.rewrite_body(f"api_key={a}".encode(), b"text/plain", set()) == f"api_key={a}".encode()
    )
    headers, used = rules.rewrite([(b"X-Custom", b.encode()), (b"Authorization", b.encode())])
    assert headers == [(b"X-Custom", b"other"), (b"Authorization", b.encode())] and used == {"B"}
    assert "replace_in_body='api_key'" in repr(
        Secret("A", VALUE, ["x.org"], replace_in_body="api_key")
    )


def test_values_with_edge_white_space_and_bad_header_lists_are_refused() -> None:
    for secret in (
        Secret("A", " tok3n", ["x.org"]),
        Secret("A", "v", ["x.org"], headers=["Host"]),
        Secret("A", "v", ["x.org"], headers=[]),
        Secret("A", "v", ["x.org"], replace_in_body=""),
    ):
        with pytest.raises(NetworkValidationError) as caught:
            parse_network_request(True, ["x.org"], None, [secret], None)
        assert "tok3n" not in str(caught.value)


def test_a_rewritten_body_is_framed_by_its_new_length() -> None:
    headers = [
        (b"Host", b"x.org"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Expect", b"100-continue"),
    ]
    assert intercept._has_body(headers)
    assert not intercept._has_body([(b"Content-Length", b"0")])
    assert intercept._framed(headers, 12) == [(b"Host", b"x.org"), (b"content-length", b"12")]


async def test_interception_fuzz_short() -> None:
    assert await fuzz_intercept.run(3.0, seed=7) > 100


async def test_a_body_cut_off_ends_the_exchange_at_once() -> None:
    """Stand-in guest and real host on socketpairs (no VM): the guest sends half a body and
    closes; the real host, waiting for the rest, never answers. The interception must end
    then, not when the idle timeout (minutes) expires."""
    import asyncio
    import socket

    from exec_sandbox.network import intercept
    from exec_sandbox.network.secrets import BoundSecret, SecretHost

    loop = asyncio.get_running_loop()
    guest, ours = socket.socketpair()
    upstream_theirs, upstream_ours = socket.socketpair()
    for sock in (guest, ours, upstream_theirs, upstream_ours):
        sock.setblocking(False)
    secret = BoundSecret("A", VALUE, (SecretHost("web.test"),), "sbx-secret-x")
    interception = intercept.Interception("web.test", 80, HostSecrets([secret], []), print)
    task = asyncio.ensure_future(interception.serve(ours, upstream_ours, None, None))
    await loop.sock_sendall(
        guest, b"POST / HTTP/1.1\r\nHost: web.test\r\nContent-Length: 100\r\n\r\nhalf"
    )
    guest.close()
    try:
        async with asyncio.timeout(5):
            await task
    finally:
        upstream_theirs.close()
    assert task.exception() is None
