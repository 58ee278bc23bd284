"""The host's network policy without a VM: allowed_domains parsing and matching, the address
deny list, the call's validation (all before any VM starts), NET_CONFIG's payload."""

from __future__ import annotations

import pytest

from exec_sandbox import PortMapping
from exec_sandbox.network import NetworkValidationError, parse_network_request
from exec_sandbox.network.addresses import denied_reason
from exec_sandbox.network.config_frame import build_net_config
from exec_sandbox.network.names import DomainRule, check_name, parse_allowed_domains
from exec_sandbox.network.policy import NetworkPolicy

NO_LOCAL: frozenset = frozenset()


def rules(*entries: str) -> tuple[DomainRule, ...]:
    result = parse_allowed_domains(list(entries))
    assert result is not None
    return result


def test_a_name_allows_itself_and_subdomains_at_a_label_boundary() -> None:
    r = rules("allowed.com")
    assert check_name(r, "allowed.com", 443) is None
    assert check_name(r, "api.allowed.com", 443) is None
    assert check_name(r, "a.b.allowed.com", 80) is None
    assert check_name(r, "xallowed.com", 443) is not None
    assert check_name(r, "allowed.com.evil.org", 443) is not None
    assert check_name(r, "com", 443) is not None


def test_only_80_and_443_unless_a_name_port_entry_opens_another() -> None:
    r = rules("git.example.org:9418", "example.net")
    assert check_name(r, "git.example.org", 9418) is None
    assert check_name(r, "git.example.org", 443) is None
    assert "port 22" in (check_name(r, "git.example.org", 22) or "")
    assert check_name(r, "example.net", 9418) is not None


def test_idna_names_are_stored_and_matched_in_ascii() -> None:
    r = rules("Bücher.example")
    assert r[0].name == "xn--bcher-kva.example"
    assert check_name(r, "shop.xn--bcher-kva.example", 443) is None


@pytest.mark.parametrize(
    "entry, words",
    [
        ("https://example.org", "URL"),
        ("example.org/path", "URL"),
        ("*", "wildcard"),
        ("*.example.org", "wildcard"),
        ("exa mple.org", "white space"),
        ("a" * 64 + ".org", "label of 64"),
        ("x" * 300, "label"),
        ("example.org:0", "1..65535"),
        ("example.org:70000", "1..65535"),
        ("example..org", "empty label"),
        ("127.0.0.1", "IP address"),
        ("2130706433", "IP address"),
        ("-bad.org", "hyphens"),
    ],
)
def test_bad_allowed_domains_are_refused_with_the_reason(entry: str, words: str) -> None:
    with pytest.raises(NetworkValidationError, match=words):
        parse_allowed_domains([entry])


def test_a_single_string_is_not_a_list_of_names() -> None:
    with pytest.raises(NetworkValidationError, match="list"):
        parse_allowed_domains("example.org")  # type: ignore[arg-type]


def test_any_public_name_needs_a_dot_and_the_default_ports() -> None:
    assert check_name(None, "pypi.example", 443) is None
    assert check_name(None, "intranet", 443) is not None
    assert check_name(None, "example.org", 22) is not None


def test_names_that_are_address_literals_are_refused_even_with_any_name() -> None:
    for literal in ("127.0.0.1", "169.254.169.254", "127.1", "2130706433", "0x7f000001"):
        assert check_name(None, literal, 80) is not None, literal


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "224.0.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "198.18.0.5",
        "198.19.255.1",
        "::1",
        "::",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "64:ff9b::8.8.8.8",
        "2002:7f00:1::1",
        "fc00::1",
        "fd12::1",
        "fe80::1",
        "ff02::1",
    ],
)
def test_denied_addresses(address: str) -> None:
    assert denied_reason(address, local=NO_LOCAL) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert denied_reason(address, local=NO_LOCAL) is None


def test_documentation_ranges_are_not_denied() -> None:
    # Some package indexes answer from these; `not is_global` would refuse them.
    assert denied_reason("192.0.2.10", local=NO_LOCAL) is None
    assert denied_reason("203.0.113.7", local=NO_LOCAL) is None


def test_private_ranges_open_only_by_the_operator_setting_and_never_loopback() -> None:
    assert denied_reason("10.1.2.3", private_ok=True, local=NO_LOCAL) is None
    assert denied_reason("fd00::5", private_ok=True, local=NO_LOCAL) is None
    assert denied_reason("127.0.0.1", private_ok=True, local=NO_LOCAL) is not None
    assert denied_reason("169.254.169.254", private_ok=True, local=NO_LOCAL) is not None


def test_the_hosts_own_addresses_are_denied() -> None:
    import ipaddress

    own = frozenset({ipaddress.ip_address("8.8.4.4")})
    assert "this host" in (denied_reason("8.8.4.4", local=own) or "")


def test_network_request_validation() -> None:
    assert parse_network_request(False, None, None) is None
    req = parse_network_request(False, None, [8000, PortMapping(9000, 19000)])
    assert req is not None and not req.outbound and len(req.ports) == 2
    with pytest.raises(NetworkValidationError, match="at most 10"):
        parse_network_request(False, None, list(range(8000, 8011)))
    with pytest.raises(NetworkValidationError, match="1..65535"):
        parse_network_request(False, None, [0])
    with pytest.raises(NetworkValidationError, match="1..65535"):
        parse_network_request(False, None, [PortMapping(80, 70000)])
    with pytest.raises(NetworkValidationError, match="allow_network=True"):
        parse_network_request(False, ["example.org"], None)
    with pytest.raises(NetworkValidationError, match="twice"):
        parse_network_request(False, None, [8000, 8000])


def test_policy_without_outbound_refuses_every_name() -> None:
    policy = NetworkPolicy(outbound=False)
    assert "allow_network" in (policy.check("example.org", 443) or "")


def test_net_config_values() -> None:
    """What NET_CONFIG tells the guest (the C core lays it out: test_execsbx_contract.py)."""
    policy = NetworkPolicy(outbound=True, rules=rules("b.example", "a.example:8443"))
    config = build_net_config(policy, b"PEM")
    assert config == (True, ["a.example", "b.example"], [8443], b"PEM")
    assert build_net_config(NetworkPolicy(outbound=True), b"") == (True, ["*"], [], b"")


def test_scheduler_config_network_fields_are_checked(tmp_path: object) -> None:
    from exec_sandbox import SchedulerConfig, VmConfigError

    assert SchedulerConfig().network_allow_private_ranges is False
    assert SchedulerConfig().network_test_hosts == {}
    with pytest.raises(VmConfigError, match="network_allow_private_ranges"):
        SchedulerConfig(network_allow_private_ranges="yes")  # type: ignore[arg-type]
    with pytest.raises(VmConfigError, match="network_test_hosts"):
        SchedulerConfig(network_test_hosts={"a.test": 80})  # type: ignore[dict-item]
    with pytest.raises(VmConfigError, match="network_ca_bundle"):
        SchedulerConfig(network_ca_bundle=3)  # type: ignore[arg-type]


async def test_run_refuses_bad_network_input_before_any_vm() -> None:
    from exec_sandbox import Scheduler, SchedulerConfig

    sched = Scheduler(SchedulerConfig(max_concurrent_vms=1))
    cases = [
        {"allow_network": True, "allowed_domains": ["https://example.org"]},
        {"allow_network": True, "allowed_domains": ["*"]},
        {"allow_network": True, "allowed_domains": ["bad name.org"]},
        {"allow_network": True, "allowed_domains": ["a" * 64 + ".org"]},
        {"expose_ports": [0]},
        {"expose_ports": list(range(9000, 9011))},
    ]
    for kwargs in cases:
        with pytest.raises(NetworkValidationError):
            await sched.run("print(1)", **kwargs)  # type: ignore[arg-type]
        with pytest.raises(NetworkValidationError):
            await sched.session(**kwargs)  # type: ignore[arg-type]
    assert not sched._started  # validation came first: nothing was even looked up
    await sched.close()
