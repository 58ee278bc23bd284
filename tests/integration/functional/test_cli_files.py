"""`sbx run --upload/--download` against a real VM, through the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm


def _sbx(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("sbx")
    return subprocess.run(
        [str(script), "run", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ.copy(),
    )


def test_upload_runs_with_the_file_and_download_brings_the_result_back(
    images_ready: None, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_bytes(b"shout this\n")
    done = _sbx(
        "-l",
        "raw",
        "-c",
        "tr a-z A-Z < data/in.txt > out.txt; wc -c < out.txt",
        "--upload",
        "in.txt:data/in.txt",
        "--download",
        "out.txt",
        "--download",
        "out.txt:renamed.txt",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "11\n"
    assert (tmp_path / "out.txt").read_bytes() == b"SHOUT THIS\n"
    assert (tmp_path / "renamed.txt").read_bytes() == b"SHOUT THIS\n"


def test_bad_upload_spec_is_a_usage_error(tmp_path: Path) -> None:
    done = _sbx("-c", "print(1)", "--upload", "missing.txt:x", cwd=tmp_path)
    assert done.returncode == 2 and "not a file" in done.stderr


def test_missing_download_is_a_sandbox_failure(images_ready: None, tmp_path: Path) -> None:
    done = _sbx("-l", "raw", "-c", "true", "--download", "nope.txt", cwd=tmp_path)
    assert done.returncode == 125 and "nope.txt" in done.stderr
    assert not (tmp_path / "nope.txt").exists()
