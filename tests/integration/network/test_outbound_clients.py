"""Every usual client in a real guest reaches an allowed name through the relay: urllib,
requests (installed as a package), Node's fetch, git over dumb HTTP, and HTTPS trusted through
the CA bundle the host sends (the test CA here). Loopback servers only (conftest.py)."""

from __future__ import annotations

import subprocess

import pytest

from exec_sandbox import Scheduler

from .conftest import BODY, Servers

pytestmark = pytest.mark.vm

NET = {"allow_network": True, "allowed_domains": ["web.test"]}


async def test_python_urllib(net_scheduler: Scheduler) -> None:
    code = "import urllib.request\nprint(urllib.request.urlopen('http://web.test/hello', timeout=20).read().decode(), end='')"  # noqa: E501
    result = await net_scheduler.run(code, **NET)
    assert (result.exit_code, result.stdout.encode()) == (0, BODY), result.stderr


async def test_python_urllib_https_trusts_the_configured_ca(net_scheduler: Scheduler) -> None:
    code = "import urllib.request\nprint(urllib.request.urlopen('https://web.test/hello', timeout=20).read().decode(), end='')"  # noqa: E501
    result = await net_scheduler.run(code, **NET)
    assert (result.exit_code, result.stdout.encode()) == (0, BODY), result.stderr
    assert any(e.port == 443 and e.allowed for e in result.network_log)


async def test_curl_https(net_scheduler: Scheduler) -> None:
    result = await net_scheduler.run(
        "curl -sS --max-time 20 https://web.test/hello", language="raw", **NET
    )
    assert (result.exit_code, result.stdout.encode()) == (0, BODY), result.stderr


async def test_node_fetch(net_scheduler: Scheduler) -> None:
    code = "fetch('https://web.test/hello').then(r => r.text()).then(t => process.stdout.write(t))"
    result = await net_scheduler.run(code, language="javascript", **NET)
    assert (result.exit_code, result.stdout.encode()) == (0, BODY), result.stderr


async def test_git_clone_over_dumb_http(net_scheduler: Scheduler, servers: Servers) -> None:
    repo = servers.root / "repo"
    work = servers.root / "work"
    git = lambda *a, cwd=work: subprocess.run(  # noqa: E731 - a one-line helper
        ["git", *a],
        cwd=cwd,
        check=True,
        capture_output=True,
    )
    if not repo.exists():
        work.mkdir()
        git("init", "-q")
        (work / "README").write_text("cloned through the relay\n")
        git("add", "README")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
        git("clone", "-q", "--bare", str(work), str(repo), cwd=servers.root)
        git("update-server-info", cwd=repo)  # what a dumb HTTP server needs
    result = await net_scheduler.run(
        "git clone -q http://web.test/repo /tmp/r && cat /tmp/r/README", language="raw", **NET
    )
    assert (result.exit_code, result.stdout) == (0, "cloned through the relay\n"), result.stderr
