"""`sbx run --network/--allow-domain/--expose` in a subprocess against real VMs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exec_sandbox.paths import images_dir

pytestmark = pytest.mark.vm

SBX = [sys.executable, "-m", "exec_sandbox.cli.main"]


def sbx(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "EXEC_SANDBOX_CACHE_DIR": str(cache),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
    }
    return subprocess.run(
        [*SBX, *args],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def test_json_prints_the_connection_log(images_ready: None, tmp_path: Path) -> None:
    # This host's own name: the guest's stub answers it, the host refuses it (its address).
    name = socket.gethostname().lower()
    code = (
        f"import urllib.request\ntry: urllib.request.urlopen('http://{name}/', timeout=15)\n"
        "except Exception as e: print('failed')"
    )
    proc = sbx("run", "--json", "--allow-domain", name, "-c", code, cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["stdout"] == "failed\n"
    (entry,) = [e for e in result["network_log"] if e["name"] == name]
    assert entry["allowed"] is False and entry["port"] == 80 and entry["reason"]


def test_expose_shows_the_url_and_serves(images_ready: None, tmp_path: Path) -> None:
    code = (
        "import socket, threading\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 7000)); s.listen()\n"
        "print('listening', flush=True)\n"
        "c, _ = s.accept(); c.sendall(b'hi from sbx'); c.shutdown(socket.SHUT_WR)\n"
        # The run (and its VM) ends with the code: wait for the client to be done first.
        "c.recv(1); c.close()\n"
    )
    proc = subprocess.Popen(
        [*SBX, "run", "--expose", "7000", "-c", code],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={
            **os.environ,
            "EXEC_SANDBOX_CACHE_DIR": str(tmp_path),
            "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
        },
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = proc.stderr.readline()
        assert line.startswith("sbx: guest port 7000 at http://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        assert proc.stdout.readline() == "listening\n"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            got = b""
            while chunk := conn.recv(100):
                got += chunk
            assert got == b"hi from sbx"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()


def test_bad_network_arguments_fail_before_any_vm(tmp_path: Path) -> None:
    for args in (
        ["--allow-domain", "https://example.org"],
        ["--allow-domain", "*"],
        ["--expose", "70000"],
        ["--expose", "abc"],
    ):
        proc = sbx("run", *args, "-c", "print(1)", cache=tmp_path)
        assert proc.returncode == 2 and "sbx:" in proc.stderr, (args, proc.stderr)


def test_bad_secret_arguments_fail_before_any_vm(tmp_path: Path) -> None:
    for args, message in (
        (["--secret", "API_KEY=SBX_TEST_UNSET_VAR@example.org"], "SBX_TEST_UNSET_VAR is unset"),
        (["--secret", "API_KEY=HOME"], "expects NAME=ENVVAR@HOST"),
        (["--secret", "API_KEY=HOME@other.org", "--allow-domain", "example.org"], "not allowed"),
    ):
        proc = sbx("run", *args, "-c", "print(1)", cache=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    for args, message in (
        (["--secret", "API_KEY=SBX_TEST_UNSET_VAR@example.org"], "SBX_TEST_UNSET_VAR is unset"),
        (["--resume", "abc", "--secret", "API_KEY=HOME@example.org"], "not saved"),
    ):
        proc = sbx("shell", *args, cache=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_secret_from_the_hosts_environment_is_a_placeholder(
    images_ready: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value comes from the host's environment (not argv); the guest sees a placeholder."""
    value = "cli-secret-value-5b1e"
    monkeypatch.setenv("SBX_TEST_TOKEN", value)
    code = "import os; print(os.environ['API_KEY'])"
    proc = sbx(
        "run", "--json", "--secret", "API_KEY=SBX_TEST_TOKEN@example.org", "-c", code,
        cache=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["stdout"].startswith("sbx-secret-"), result["stdout"]
    assert value not in proc.stdout + proc.stderr
