"""`sbx run` in a subprocess against real VMs: exit status, language detection, --json, and the
memory snapshot a first run leaves behind."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exec_sandbox.paths import images_dir

pytestmark = pytest.mark.vm
SBX = [sys.executable, "-m", "exec_sandbox.cli.main"]


def sbx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SBX, *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )


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


def test_rich_outputs_are_named_on_a_terminal_and_carried_in_json(images_ready: None) -> None:
    code = "class P:\n    def _repr_png_(self):\n        return b'\\x89PNG-bytes'\ndisplay(P())\n"
    proc = sbx("run", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "[output: image/png, 10 bytes; --json to get it]" in proc.stderr
    proc = sbx("run", "--json", "-c", code)
    outputs = json.loads(proc.stdout)["outputs"]
    png = {"mime_type": "image/png", "data": base64.b64encode(b"\x89PNG-bytes").decode()}
    assert outputs[0] == {**png, "encoding": "base64"}
    assert outputs[1]["mime_type"] == "text/plain" and "encoding" not in outputs[1]


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


def test_first_run_leaves_a_snapshot_that_the_next_run_restores(
    images_ready: None, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "EXEC_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
    }
    snapshots = tmp_path / "cache" / "memory-snapshots"
    first = sbx("run", "--json", "-c", "print(1)", env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["l1_cache_hit"] is False
    # The build the cold boot started was waited for, not cancelled by the exit.
    assert _languages(snapshots) == ["python"]
    second = sbx("run", "--json", "-c", "print(2)", env=env)
    result = json.loads(second.stdout)
    assert (second.returncode, result["stdout"], result["l1_cache_hit"]) == (0, "2\n", True)
    # --no-snapshot-wait exits at once: the build of this other configuration is cancelled and
    # cleaned up, nothing of it is left.
    third = sbx("run", "--json", "--no-snapshot-wait", "-l", "raw", "-c", "echo 3", env=env)
    assert (third.returncode, json.loads(third.stdout)["stdout"]) == (0, "3\n")
    assert _languages(snapshots) == ["python"]


def _languages(cache: Path) -> list[str]:
    """The first name part of every entry of the snapshot cache, dot entries (a build, trash)
    included; none if it does not exist. Not the VMs' work disks' directory, which holds no
    name (its files are nameless while their VMs run)."""
    assert not (cache / "disks").is_dir() or list((cache / "disks").iterdir()) == []
    return sorted(p.name.split("-")[0] for p in cache.glob("*") if p.name != "disks")
