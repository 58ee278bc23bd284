"""Fixtures shared by every test. VM tests get their Scheduler from `scheduler`, which proves at
teardown that no QEMU process and no fd of the test outlived it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, SchedulerConfig
from exec_sandbox.images.catalog import MANIFEST_NAME
from exec_sandbox.paths import images_dir
from tests.helpers import open_fds, private_config, qemu_processes

# The template tests' images and loopback registry (session-scoped: made once per worker).
from tests.templates_support import busybox_image, registry  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # VM tests need the images; without them they must fail, not pass vacuously, unless the
    # caller opted out explicitly (EXEC_SANDBOX_SKIP_VM_TESTS=1, for a machine without QEMU).
    if os.environ.get("EXEC_SANDBOX_SKIP_VM_TESTS") == "1":
        skip = pytest.mark.skip(reason="EXEC_SANDBOX_SKIP_VM_TESTS=1 set by the caller")
        for item in items:
            if "vm" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def images_ready() -> None:
    manifest = images_dir() / MANIFEST_NAME
    assert manifest.is_file(), f"{manifest} missing: run `make images` before the VM tests"


@pytest.fixture
async def scheduler(images_ready: None) -> AsyncIterator[Scheduler]:
    fds_before = open_fds()
    async with Scheduler(SchedulerConfig(max_concurrent_vms=4)) as sched:
        yield sched
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"
    leaked = {fd for fd in open_fds() - fds_before if not fd.startswith("anon_inode:[event")}
    assert not leaked, f"fds outlived the Scheduler: {leaked}"


@pytest.fixture
async def sched(tmp_path: Path, images_ready: None) -> AsyncIterator[Scheduler]:
    """A Scheduler of tests/helpers.private_config: caches of the test's own."""
    async with Scheduler(private_config(tmp_path)) as scheduler:
        yield scheduler
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"
