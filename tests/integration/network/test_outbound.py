"""Outbound network by name, end to end: guest code in a real VM connects to names; the host
decides, resolves and relays. Only this host's loopback servers are reached (conftest.py)."""

from __future__ import annotations

import pytest

from exec_sandbox import Scheduler

from .conftest import BODY, Servers

pytestmark = pytest.mark.vm


async def test_curl_reaches_an_allowed_name(net_scheduler: Scheduler) -> None:
    result = await net_scheduler.run("curl -sS --max-time 20 http://web.test/hello",
                                     language="raw", allow_network=True,
                                     allowed_domains=["web.test"])  # fmt: skip
    assert result.stderr == "" and result.exit_code == 0, result
    assert result.stdout.encode() == BODY
    (entry,) = [e for e in result.network_log if e.name == "web.test"]
    assert entry.allowed and entry.port == 80 and entry.addresses == ("127.0.0.1",)
    assert entry.bytes_received > len(BODY) and entry.bytes_sent > 0
