"""Live: HTTPS from a real guest to the package index the host's pip uses (read from pip's
configuration at test time; its name is never written in this repository), through the relay,
trusting what the host trusts; another name refused. The only tests that leave this host."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from exec_sandbox import Scheduler
from tests.helpers import private_config, qemu_processes

pytestmark = pytest.mark.vm


def pip_setting(suffix: str) -> str | None:
    """The value of pip's first setting whose key ends with suffix (environment included)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    for key in ("PIP_" + suffix.upper().replace("-", "_"),):
        if os.environ.get(key):
            return os.environ[key].split()[0]
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("." + suffix):
            return value.strip().strip("'\"").split()[0]
    return None


def index_url() -> str:
    """pip's index: its configured index-url, else pip's own default (asked from pip)."""
    url = pip_setting("index-url")
    if not url:
        from pip._internal.models.index import PyPI  # pip's built-in default index

        url = PyPI.simple_url
    if not url or not url.startswith("https://"):
        pytest.skip("pip has no https index configured on this host (pip config list)")
    return url.rstrip("/") + "/"


@pytest.fixture
async def live_scheduler(images_ready: None, tmp_path: Path) -> AsyncIterator[Scheduler]:
    cert = pip_setting("cert")  # what the host's pip trusts for the index, if set
    overrides = {"network_ca_bundle": Path(cert)} if cert and Path(cert).is_file() else {}
    async with Scheduler(private_config(tmp_path, **overrides)) as sched:
        yield sched
    assert qemu_processes(parent=os.getpid()) == []


async def test_https_to_the_package_index_and_another_name_refused(
    live_scheduler: Scheduler,
) -> None:
    url = index_url()
    host = urlsplit(url).hostname
    assert host
    code = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen({url!r}, timeout=60).status)\n"
        "try:\n"
        "    urllib.request.urlopen('https://example.org/', timeout=20)\n"
        "    print('REACHED')\n"
        "except Exception as exc:\n"
        "    print('REFUSED', type(exc).__name__)\n"
    )
    result = await live_scheduler.run(
        code, allow_network=True, allowed_domains=[host], timeout_seconds=120
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "200" and "REFUSED" in lines, result.stdout
    entries = [e for e in result.network_log if e.name == host]
    assert entries and all(e.allowed for e in entries) and entries[0].port == 443
    assert entries[0].bytes_received > 0


async def test_requests_reaches_the_package_index(live_scheduler: Scheduler) -> None:
    url = index_url()
    code = f"import requests\nprint(requests.get({url!r}, timeout=60).status_code)"
    result = await live_scheduler.run(
        code,
        packages=["requests==2.31.0"],
        allow_network=True,
        allowed_domains=[urlsplit(url).hostname or ""],
        timeout_seconds=180,
    )
    assert (result.exit_code, result.stdout) == (0, "200\n"), result.stderr
