"""Isolation proven from inside the guest: its own kernel, no view of the host's files, and
nothing carried from one run() to the next."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from exec_sandbox import Scheduler

pytestmark = pytest.mark.vm


async def test_guest_runs_its_own_kernel(scheduler: Scheduler) -> None:
    result = await scheduler.run("uname -r; cat /proc/version", language="raw")
    release = result.stdout.splitlines()[0]
    assert release != os.uname().release
    assert release.startswith("6.1.")


async def test_host_file_is_not_visible_in_the_guest(scheduler: Scheduler, tmp_path: Path) -> None:
    secret = Path("/tmp") / f"exec-sandbox-host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only")
    try:
        code = f"import os; print(os.path.exists({str(secret)!r}), os.listdir('/tmp'))"
        result = await scheduler.run(code)
    finally:
        secret.unlink()
    assert result.stdout.startswith("False ")
    assert secret.name not in result.stdout


async def test_nothing_from_one_run_is_visible_in_the_next(scheduler: Scheduler) -> None:
    first = await scheduler.run(
        "echo one > /tmp/marker; echo two > ~/marker; export LEAK=1; echo done", language="raw"
    )
    assert first.stdout == "done\n"
    second = await scheduler.run(
        'ls /tmp/marker ~/marker 2>&1; echo "LEAK=${LEAK:-unset}"', language="raw"
    )
    assert "No such file" in second.stdout
    assert second.stdout.count("No such file") == 2
    assert "LEAK=unset" in second.stdout


async def test_root_file_system_is_read_only(scheduler: Scheduler) -> None:
    result = await scheduler.run("awk '$2 == \"/\" {print $3, $4}' /proc/mounts", language="raw")
    fstype, options = result.stdout.split()
    assert fstype == "erofs"
    assert options.split(",")[0] == "ro"
