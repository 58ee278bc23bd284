"""Outbound network by name, end to end: guest code in a real VM connects to names; the host
decides, resolves and relays. Only this host's loopback servers are reached (conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_sandbox import Scheduler

from .conftest import BODY, Servers

pytestmark = pytest.mark.vm


async def test_curl_reaches_an_allowed_name(net_scheduler: Scheduler) -> None:
    result = await net_scheduler.run(
        "curl -sS --max-time 20 http://web.test/hello",
        language="raw",
        allow_network=True,
        allowed_domains=["web.test"],
    )
    assert result.stderr == "" and result.exit_code == 0, result
    assert result.stdout.encode() == BODY
    (entry,) = [e for e in result.network_log if e.name == "web.test"]
    assert entry.allowed and entry.port == 80 and entry.addresses == ("127.0.0.1",)
    assert entry.bytes_received > len(BODY) and entry.bytes_sent > 0


async def test_network_vms_restore_from_their_own_snapshot(
    images_ready: None, servers: Servers, tmp_path: Path
) -> None:
    from exec_sandbox import SchedulerConfig  # noqa: F401 (private_config builds it)
    from tests.helpers import private_config

    config = private_config(
        tmp_path,
        memory_snapshots=True,
        network_test_hosts={"web.test:80": f"127.0.0.1:{servers.http_port}"},
    )
    code = "curl -sS --max-time 20 http://web.test/hello"
    async with Scheduler(config) as sched:
        first = await sched.run(
            code, language="raw", allow_network=True, allowed_domains=["web.test"]
        )
        assert first.stdout.encode() == BODY and not first.l1_cache_hit
        assert await sched.wait_snapshots(timeout=240)
        second = await sched.run(
            code, language="raw", allow_network=True, allowed_domains=["web.test"]
        )
        assert second.l1_cache_hit, "the network VM's snapshot was not used"
        assert second.stdout.encode() == BODY, second.stderr
        # A plain VM does not take the network VM's snapshot (another device layout).
        plain = await sched.run("echo plain", language="raw")
        assert plain.stdout == "plain\n" and not plain.l1_cache_hit
