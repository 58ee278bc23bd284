"""`sbx run` in a subprocess against real VMs: exit status, language detection, --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm
SBX = [sys.executable, "-m", "exec_sandbox.cli"]


def sbx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SBX, *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)  # fmt: skip


def test_exit_status_is_the_codes(images_ready: None) -> None:
    proc = sbx("run", "-c", "import sys; print('out'); sys.exit(7)")
    assert proc.returncode == 7
    assert proc.stdout == "out\n"


def test_language_is_detected_from_the_file_extension(images_ready: None, tmp_path: Path) -> None:
    script = tmp_path / "hello.js"
    script.write_text("console.log(typeof process.versions.node)")
    proc = sbx("run", str(script))
    assert (proc.returncode, proc.stdout) == (0, "string\n")


def test_json_output_carries_the_result(images_ready: None) -> None:
    proc = sbx("run", "--json", "-l", "raw", "-e", "NAME=vm", "-c", "echo hi $NAME; echo e >&2")
    result = json.loads(proc.stdout)
    assert proc.returncode == 0
    assert (result["stdout"], result["stderr"], result["exit_code"]) == ("hi vm\n", "e\n", 0)
    assert result["timing"]["total_ms"] > 0


def test_timeout_exits_124(images_ready: None) -> None:
    proc = sbx("run", "-t", "1", "-c", "import time; time.sleep(30)")
    assert proc.returncode == 124
    assert "timed out" in proc.stderr


def test_bad_input_exits_2_before_any_vm(tmp_path: Path) -> None:
    proc = sbx("run", "-c", "   ")
    assert proc.returncode == 2
    assert "empty" in proc.stderr
    unknown = tmp_path / "x.rb"
    unknown.write_text("puts 1")
    proc = sbx("run", str(unknown))
    assert proc.returncode == 2 and "language" in proc.stderr
