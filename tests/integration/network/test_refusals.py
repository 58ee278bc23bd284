"""What a guest may NOT reach, in real VMs: names outside allowed_domains, IP literals, names the
host resolves to loopback or to itself, the cloud metadata address; and the network is off
unless asked for. Loopback servers only (conftest.py)."""

from __future__ import annotations

import socket

import pytest

from exec_sandbox import Scheduler

pytestmark = pytest.mark.vm

FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen(sys.argv[1] if len(sys.argv) > 1 else URL, timeout=15)\n"
    "    print('REACHED')\n"
    "except Exception as exc:\n"
    "    print('FAILED', type(exc).__name__, exc)\n"
)


def fetch(url: str) -> str:
    return f"URL = {url!r}\n" + FETCH


async def test_network_is_off_by_default(net_scheduler: Scheduler) -> None:
    result = await net_scheduler.run(
        fetch("http://web.test/hello") + "import os\nprint(sorted(os.listdir('/dev/virtio-ports')))"
    )
    assert result.stdout.startswith("FAILED"), result.stdout
    assert "org.execsandbox.net.0" not in result.stdout  # no network port at all
    assert result.network_log == [] and result.exposed_ports == []


async def test_a_name_outside_allowed_domains_is_not_reached(net_scheduler: Scheduler) -> None:
    # web.test is mapped to a live server by the test hook, but not allowed for this call.
    result = await net_scheduler.run(
        fetch("http://web.test/hello"), allow_network=True, allowed_domains=["other.test"]
    )
    assert result.stdout.startswith("FAILED"), result.stdout
    assert all(e.name != "web.test" or not e.allowed for e in result.network_log)


async def test_names_the_guest_refuses_are_reported_by_the_guest(net_scheduler: Scheduler) -> None:
    # Refused by the guest's own DNS stub: no stream, nothing asked of the host; the guest's
    # report is what puts the attempt in the log, marked as its word.
    result = await net_scheduler.run(
        fetch("http://blocked.example/") + fetch("http://web.test/hello"),
        allow_network=True,
        allowed_domains=["web.test"],
    )
    assert result.stdout.startswith("FAILED"), result.stdout
    (entry,) = [e for e in result.network_log if e.name == "blocked.example"]
    assert (entry.direction, entry.port, entry.allowed) == ("outbound", 0, False), entry
    assert entry.reported_by_guest and "allowed_domains" in entry.reason, entry
    allowed = [e for e in result.network_log if e.name == "web.test"]
    assert allowed and not any(e.reported_by_guest for e in allowed), result.network_log


async def test_a_lookalike_name_is_not_a_subdomain(net_scheduler: Scheduler) -> None:
    result = await net_scheduler.run(
        fetch("http://xweb.test/hello"), allow_network=True, allowed_domains=["web.test"]
    )
    assert result.stdout.startswith("FAILED"), result.stdout


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://8.8.8.8/",
        "http://[::1]/",
    ],
)
async def test_ip_literals_have_no_route(net_scheduler: Scheduler, url: str) -> None:
    result = await net_scheduler.run(fetch(url), allow_network=True)
    assert result.stdout.startswith("FAILED"), result.stdout
    # Nothing reached the host; the guest reset the connection and reported it, but to loopback,
    # which is the guest talking to itself.
    if "127.0.0.1" in url or "[::1]" in url:
        assert result.network_log == []
        return
    address = url.split("/")[2]
    (entry,) = result.network_log
    assert (entry.name, entry.port, entry.allowed) == (address, 80, False), entry
    assert entry.reported_by_guest and "IP literal" in entry.reason, entry


async def test_an_unassigned_synthetic_address_is_reported_by_the_guest(
    net_scheduler: Scheduler,
) -> None:
    # 198.18.0.1 is the guest's own; no name was given 198.19.7.7.
    result = await net_scheduler.run(
        fetch("https://198.19.7.7/"), allow_network=True, allowed_domains=["web.test"]
    )
    assert result.stdout.startswith("FAILED"), result.stdout
    (entry,) = result.network_log
    assert (entry.name, entry.port, entry.reported_by_guest) == ("198.19.7.7", 443, True), entry


async def test_a_name_the_host_resolves_to_itself_is_refused(net_scheduler: Scheduler) -> None:
    # No test hook for it: the host's own resolver answers loopback or one of its addresses.
    name = socket.gethostname().lower()
    result = await net_scheduler.run(
        fetch(f"http://{name}/"), allow_network=True, allowed_domains=[name]
    )
    assert result.stdout.startswith("FAILED"), result.stdout
    (entry,) = [e for e in result.network_log if e.name == name]
    assert not entry.allowed and ("loopback" in entry.reason or "this host" in entry.reason), entry
    assert entry.addresses  # what the host's resolver said, recorded


async def test_localhost_in_the_guest_is_the_guest(net_scheduler: Scheduler) -> None:
    # The guest resolves "localhost" itself (its /etc/hosts): it never becomes a stream, so the
    # host's loopback stays out of reach even with every public name allowed. (The host's
    # refusal of an OPEN for "localhost" is tested with a lying guest, test_lying_guest.py.)
    result = await net_scheduler.run(fetch("http://localhost/"), allow_network=True)
    assert result.stdout.startswith("FAILED"), result.stdout
    assert result.network_log == []
