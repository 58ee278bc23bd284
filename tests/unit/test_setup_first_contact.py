"""What a user meets before the images exist, and what an interrupted or failed build leaves:
the Scheduler's error names `sbx setup`; `sbx doctor` names each missing build tool with its fix;
a killed build's staging directory is removed by the next build; a full disk is said in words."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig, VmPermanentError
from exec_sandbox.cli import doctor
from exec_sandbox.images import builder

LIB = Path(__file__).resolve().parents[2] / "images" / "lib.sh"


async def test_scheduler_without_images_says_to_run_sbx_setup(tmp_path: Path) -> None:
    with pytest.raises(VmPermanentError, match="run `sbx setup`"):
        async with Scheduler(SchedulerConfig(images_dir=tmp_path)):
            pass


def test_doctor_names_a_missing_build_tool_and_its_apt_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: bison among the missing
    checks = {c.name: c for c in doctor._setup_checks(images_ready=False)}
    bison = checks["setup: bison"]
    assert not bison.ok and bison.required
    assert "apt-get install -y --no-install-recommends bison" in bison.detail


def test_doctor_setup_checks_are_optional_once_images_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not any(c.required for c in doctor._setup_checks(images_ready=True))


def test_next_build_removes_what_a_killed_build_left(tmp_path: Path) -> None:
    leftover = tmp_path / ".staging-kernel-build.abc123"
    (leftover / "linux-source-6.1").mkdir(parents=True)
    env = {**os.environ, "EXEC_SANDBOX_IMAGES_DIR": str(tmp_path)}
    env.pop("EXEC_SANDBOX_IMAGES_LOCKED", None)
    subprocess.run(["bash", "-c", f'source "{LIB}"'], env=env, check=True, capture_output=True)
    assert not leftover.exists()


def test_full_disk_is_reported_as_such(tmp_path: Path) -> None:
    message = builder._failure_message(
        1, ["tar: linux-source-6.1/x.c: Cannot write: No space left on device"], tmp_path
    )
    assert "is full" in message and "sbx setup" in message
