"""A VM that fails before anything was dispatched is a VM-start error, not "outcome unknown":
VmTransientError (the code never ran, retrying is safe) with QEMU's own
message, or VmPermanentError where retrying cannot help."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.errors import CommunicationOutcomeUnknownError, VmPermanentError, VmTransientError
from exec_sandbox.images.catalog import MANIFEST_NAME
from exec_sandbox.paths import images_dir
from exec_sandbox.vm import host_facts
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm


@pytest.fixture(autouse=True)
def fresh_host_caches() -> Iterator[None]:
    # The QEMU path and the accelerator are cached per process: keep this file's stand-ins out
    # of the other tests.
    host_facts.qemu_binary.cache_clear()
    host_facts.accelerator.cache_clear()
    yield
    host_facts.qemu_binary.cache_clear()
    host_facts.accelerator.cache_clear()


def _config(**kw: object) -> SchedulerConfig:
    return SchedulerConfig(max_concurrent_vms=1, warm_pool_size=0, memory_snapshots=False, **kw)


async def test_qemu_that_exits_at_once_is_a_transient_start_error(
    images_ready: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXEC_SANDBOX_ACCEL", "tcg")  # no KVM probe with a stand-in binary
    monkeypatch.setenv("EXEC_SANDBOX_QEMU", "/bin/false")
    async with Scheduler(_config()) as scheduler:
        with pytest.raises(VmTransientError, match="QEMU exited with status 1") as caught:
            await scheduler.run("print(1)")
    assert not isinstance(caught.value, CommunicationOutcomeUnknownError)
    assert qemu_processes(parent=os.getpid()) == []


async def test_missing_qemu_binary_is_a_permanent_error(
    images_ready: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EXEC_SANDBOX_ACCEL", "tcg")
    monkeypatch.setenv("EXEC_SANDBOX_QEMU", str(tmp_path / "no-such-qemu"))
    # With memory snapshots on, start() asks the binary for its version first.
    config = SchedulerConfig(
        max_concurrent_vms=1, warm_pool_size=0, memory_snapshot_cache_dir=tmp_path / "snapshots"
    )
    with pytest.raises(VmPermanentError, match="no-such-qemu"):
        async with Scheduler(config) as scheduler:
            await scheduler.run("print(1)")


async def test_kernel_that_is_not_a_kernel_carries_qemus_message(
    images_ready: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The same images, but a kernel file that holds text: QEMU refuses to load it.
    manifest = json.loads((images_dir() / MANIFEST_NAME).read_text())
    bogus = tmp_path / "vmlinux-bogus"
    bogus.write_text("not a kernel\n")
    manifest["kernel"] = str(bogus)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    async with Scheduler(_config(images_dir=tmp_path)) as scheduler:
        with pytest.raises(VmTransientError, match="QEMU exited") as caught:
            await scheduler.run("print(1)")
    assert not isinstance(caught.value, CommunicationOutcomeUnknownError)
    assert "console:" in str(caught.value), caught.value  # QEMU's own words are attached
