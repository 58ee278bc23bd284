"""Packages from the package index the host's pip is configured with (live: this machine reaches
it; its name is never written here). Real wheels, pure and native, in real VMs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exec_sandbox import PackageNotAllowedError, Scheduler, SchedulerConfig
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One package cache for the module: its later tests are served from what earlier ones built."""
    return tmp_path_factory.mktemp("live-packages")


def _config(cache_dir: Path) -> SchedulerConfig:
    return SchedulerConfig(
        max_concurrent_vms=2, memory_snapshots=False, package_cache_dir=cache_dir
    )


@pytest.fixture
async def sched(cache_dir: Path, images_ready: None) -> AsyncIterator[Scheduler]:
    async with Scheduler(_config(cache_dir)) as scheduler:
        yield scheduler
    assert qemu_processes(parent=os.getpid()) == []


async def test_a_pure_wheel(sched: Scheduler) -> None:
    result = await sched.run("import six; print(six.__version__)", packages=["six==1.16.0"])
    assert (result.stdout, result.exit_code) == ("1.16.0\n", 0)


async def test_a_native_wheel(sched: Scheduler) -> None:
    code = "import numpy as np; print(np.__version__, int(np.arange(10).sum()), np.ones((2, 2)).dot(np.ones(2)))"  # noqa: E501
    result = await sched.run(code, packages=["numpy==2.1.3"], timeout_seconds=120)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "2.1.3 45 [2. 2.]\n"


async def test_a_session_keeps_state_with_packages(sched: Scheduler) -> None:
    async with await sched.session(packages=["six==1.16.0"]) as session:
        await session.exec("import six\nitems = list(six.moves.range(3))")
        assert (await session.exec("print(items)")).stdout == "[0, 1, 2]\n"


async def test_the_second_run_needs_no_index(
    cache_dir: Path, images_ready: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Scheduler(_config(cache_dir)) as scheduler:
        await scheduler.run("import six", packages=["six==1.16.0"])
    # From here on pip can reach nothing: any resolve or download would fail.
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",
        "PIP_FIND_LINKS": "",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_RETRIES": "0",
        "PIP_NO_CACHE_DIR": "1",
    }.items():
        monkeypatch.setenv(name, value)
    async with Scheduler(_config(cache_dir)) as scheduler:
        result = await scheduler.run("import six; print(six.__version__)", packages=["six==1.16.0"])
        assert result.stdout == "1.16.0\n"
        assert result.packages is not None
        assert result.packages.cache_hit and not result.packages.resolved
        assert (
            scheduler._provisioner.layers.resolves == 0
            and scheduler._provisioner.layers.builds == 0
        )


async def test_an_unknown_package_is_refused(sched: Scheduler) -> None:
    with pytest.raises(PackageNotAllowedError, match="sbx-no-such-package-7f3a"):
        await sched.run("print(1)", packages=["sbx-no-such-package-7f3a==1.0.0"])


async def test_a_source_only_package_is_refused(sched: Scheduler) -> None:
    with pytest.raises(PackageNotAllowedError, match="docopt.*source only"):
        await sched.run("import docopt", packages=["docopt==0.6.2"])
