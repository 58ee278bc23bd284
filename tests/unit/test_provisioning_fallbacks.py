"""Provisioning's fallback policy (provisioning.py) through a Scheduler whose VMs are GUEST
STAND-INS (tests/unit/guest_stand_in.py: processes speaking the agent's frames in QEMU's place,
no VM): an L1 snapshot missing, damaged or failing to restore means a cold boot, and a cold boot
that fails is a VmTransientError with the start's own message. The L1 snapshots here are cache
directories in the cache's format whose state is not a real stream: the stand-in factory's
restore decides whether a clone comes up. Real restores: tests/integration/functional."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_sandbox import Scheduler, VmTransientError
from exec_sandbox.snapshots.l1 import snapshot_key
from tests.unit.guest_stand_in import StandInVms, publish_l1_snapshot, stand_in_scheduler


def _l1_key(scheduler: Scheduler) -> str:
    spec = scheduler._provisioner.spec(
        scheduler.config.default_memory_mb, disk_mb=scheduler.config.default_disk_mb
    )
    return snapshot_key(spec, "python")


async def test_without_an_l1_snapshot_the_vm_cold_boots_and_the_snapshot_is_built(
    tmp_path: Path,
) -> None:
    async with stand_in_scheduler(tmp_path, memory_snapshots=True) as (scheduler, vms):
        result = await scheduler.run("out cold")
        assert result.stdout == "cold\n" and not result.l1_cache_hit
        assert vms.started[0] == "boot"
        await scheduler.wait_snapshots(timeout=30)
        # The build booted a template (a stand-in has no QMP, so it could not be saved).
        assert vms.started == ["boot", "boot"]
        assert not (scheduler.config.memory_snapshot_cache_dir / _l1_key(scheduler)).exists()


async def test_an_l1_snapshot_is_restored_instead_of_booted(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path, memory_snapshots=True) as (scheduler, vms):
        publish_l1_snapshot(
            scheduler.config.memory_snapshot_cache_dir,
            _l1_key(scheduler),
            scheduler.config.default_memory_mb,
            damaged=False,
            disk_mb=scheduler.config.default_disk_mb,
        )
        result = await scheduler.run("out clone")
        assert result.stdout == "clone\n" and result.l1_cache_hit
        assert vms.started == ["restore"]


async def test_a_damaged_l1_snapshot_is_discarded_and_the_vm_cold_boots(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path, memory_snapshots=True) as (scheduler, vms):
        key = _l1_key(scheduler)
        publish_l1_snapshot(
            scheduler.config.memory_snapshot_cache_dir,
            key,
            scheduler.config.default_memory_mb,
            damaged=True,
            disk_mb=scheduler.config.default_disk_mb,
        )
        result = await scheduler.run("out cold")
        assert result.stdout == "cold\n" and not result.l1_cache_hit
        # The RAM did not match its digest: no clone was even tried, the request booted.
        assert vms.started[0] == "boot"
        assert not (scheduler.config.memory_snapshot_cache_dir / key).exists()
        await scheduler.wait_snapshots(timeout=30)
        assert vms.started == ["boot", "boot"]  # a damaged snapshot is rebuilt once


async def test_an_l1_snapshot_that_fails_to_restore_is_dropped_and_not_rebuilt(
    tmp_path: Path,
) -> None:
    vms = StandInVms(
        tmp_path / "stand-in",
        restore_errors=[VmTransientError("stand-in: the clone did not come up")],
    )
    async with stand_in_scheduler(tmp_path, vms, memory_snapshots=True) as (scheduler, _):
        key = _l1_key(scheduler)
        publish_l1_snapshot(
            scheduler.config.memory_snapshot_cache_dir,
            key,
            scheduler.config.default_memory_mb,
            damaged=False,
            disk_mb=scheduler.config.default_disk_mb,
        )
        result = await scheduler.run("out cold")
        assert result.stdout == "cold\n" and not result.l1_cache_hit
        assert vms.started == ["restore", "boot"]
        assert not (scheduler.config.memory_snapshot_cache_dir / key).exists()
        await scheduler.wait_snapshots(timeout=30)
        second = await scheduler.run("out again")
        # Not rebuilt (this QEMU could not load it): the next request boots as well.
        assert not second.l1_cache_hit and vms.started == ["restore", "boot", "boot"]


async def test_a_failing_cold_boot_is_a_transient_error_with_the_start_message(
    tmp_path: Path,
) -> None:
    vms = StandInVms(tmp_path / "stand-in", boot_modes=["exit"])
    async with stand_in_scheduler(tmp_path, vms) as (scheduler, _):
        with pytest.raises(VmTransientError, match="refusing to boot"):
            await scheduler.run("out never")
        assert scheduler.capacity().vms_in_use == 0
        # The next start works: one failure does not poison the scheduler.
        assert (await scheduler.run("out fine")).stdout == "fine\n"
