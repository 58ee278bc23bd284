"""Bad input raises the matching exception before any VM starts. These tests point the
Scheduler at an empty images directory: if validation came after the VM layer they would see
VmPermanentError ("no guest images") instead of the validation error."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_sandbox import (
    CodeValidationError,
    EnvVarValidationError,
    InputValidationError,
    Scheduler,
    SchedulerConfig,
    VmConfigError,
    VmPermanentError,
)


@pytest.fixture
def scheduler(tmp_path: Path) -> Scheduler:
    return Scheduler(SchedulerConfig(images_dir=tmp_path / "no-images"))


@pytest.mark.parametrize("code", ["", "   \n\t "])
async def test_empty_code_is_rejected(scheduler: Scheduler, code: str) -> None:
    with pytest.raises(CodeValidationError, match="empty"):
        await scheduler.run(code)


async def test_nul_byte_in_code_is_rejected(scheduler: Scheduler) -> None:
    with pytest.raises(CodeValidationError, match="NUL"):
        await scheduler.run("print(1)\x00")


async def test_code_over_one_megabyte_is_rejected(scheduler: Scheduler) -> None:
    with pytest.raises(CodeValidationError, match="limit"):
        await scheduler.run("#" * (1024 * 1024 + 1))


async def test_unknown_language_is_rejected(scheduler: Scheduler) -> None:
    with pytest.raises(CodeValidationError, match="unknown language"):
        await scheduler.run("print(1)", language="ruby")  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [86_401, 0.5, -5, "10", True])
async def test_timeout_outside_range_is_rejected(scheduler: Scheduler, timeout: object) -> None:
    with pytest.raises(InputValidationError, match="timeout_seconds"):
        await scheduler.run("print(1)", timeout_seconds=timeout)  # type: ignore[arg-type]


async def test_memory_below_128_is_rejected(scheduler: Scheduler) -> None:
    with pytest.raises(InputValidationError, match="memory_mb"):
        await scheduler.run("print(1)", memory_mb=127)


@pytest.mark.parametrize(
    "env",
    [
        {"LD_PRELOAD": "/x.so"},
        {"pythonpath": "/x"},
        {"NODE_OPTIONS": "-r x"},
        {"BASH_ENV": "x"},
        {"1BAD": "x"},
        {"OK": "a\x00b"},
        {"OK": "bell\x07"},
        {f"V{i}": "x" for i in range(101)},
        {"OK": "lone \ud800 surrogate"},
        {"OK": "\udcff"},
    ],
)
async def test_bad_env_vars_are_rejected(scheduler: Scheduler, env: dict[str, str]) -> None:
    with pytest.raises(EnvVarValidationError):
        await scheduler.run("print(1)", env_vars=env)


async def test_valid_input_reaches_the_vm_layer(scheduler: Scheduler) -> None:
    # The control for the tests above: good input gets past validation to the missing images.
    with pytest.raises(VmPermanentError, match="no guest images"):
        await scheduler.run("print(1)", env_vars={"GOOD_NAME": "value\twith tab"})


@pytest.mark.parametrize(
    "field,value",
    [
        ("default_memory_mb", 64),
        ("default_timeout_seconds", 0),
        ("default_timeout_seconds", 86_401),
        ("session_idle_timeout_seconds", 5),
        ("warm_pool_size", -1),
        ("max_concurrent_vms", 0),
        ("memory_overcommit_ratio", 0),
        ("default_memory_mb", True),
    ],
)
def test_bad_config_raises_vm_config_error(field: str, value: object) -> None:
    with pytest.raises(VmConfigError, match=field):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]


def test_default_config_derives_a_concurrency_limit() -> None:
    config = SchedulerConfig()
    assert config.max_concurrent_vms is not None and config.max_concurrent_vms >= 1
    assert config.default_memory_mb == 192 and config.default_timeout_seconds == 30


def test_disk_snapshot_cache_dir_is_a_deprecated_name_of_the_package_cache(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="package_cache_dir"):
        config = SchedulerConfig(disk_snapshot_cache_dir=tmp_path / "old")
    assert config.package_cache_dir == tmp_path / "old" / "packages"
    assert SchedulerConfig(package_cache_dir=tmp_path / "new").package_cache_dir == tmp_path / "new"
