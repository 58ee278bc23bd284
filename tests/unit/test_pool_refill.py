"""The warm pool inside a Scheduler, its VMs coming from provisioning (start, warm-up, PRESTART),
with GUEST STAND-INS for VMs (tests/unit/guest_stand_in.py: processes speaking the agent's frames
in QEMU's place, no VM). tests/unit/test_warm_pool.py covers the pool's own bookkeeping with
objects for VMs; the speed of a real pool hit is for tests/integration and bench/."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from pathlib import Path

import pytest

from exec_sandbox import Template, VmTransientError
from exec_sandbox.provisioning import pool as pool_module
from exec_sandbox.templates.store import TemplateStore
from exec_sandbox.vm.registry import VmRegistry
from exec_sandbox.vm.spec import VmSpec
from tests.unit.guest_stand_in import StandInVms, stand_in_scheduler

HANG_GUARD_SECONDS = 30.0


async def test_a_pool_hit_serves_the_request_and_the_pool_refills(tmp_path: Path) -> None:
    async with stand_in_scheduler(tmp_path, warm_pool_size={"python": 1}) as (scheduler, vms):
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert vms.started == ["boot"]
        result = await scheduler.run("out pooled")
        assert result.stdout == "pooled\n" and result.warm_pool_hit
        assert vms.started == ["boot"]  # served by the pooled VM: nothing started for it
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert vms.started == ["boot", "boot"]  # the refill replaced it
        assert scheduler.capacity().warm_pool == {"python": 1, "javascript": 0, "raw": 0}


async def test_a_pooled_vm_that_died_idle_is_discarded_and_the_request_boots(
    tmp_path: Path,
) -> None:
    async with stand_in_scheduler(tmp_path, warm_pool_size={"python": 1}) as (scheduler, vms):
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        pooled = vms.vms[0]
        os.kill(pooled.pid, signal.SIGKILL)
        while pooled.alive:  # until the loop has seen its exit
            await asyncio.sleep(0.01)
        result = await scheduler.run("out fresh")
        assert result.stdout == "fresh\n" and not result.warm_pool_hit
        # The request had to boot its own VM; the dead pooled one gave its ticket back.
        assert vms.started[:2] == ["boot", "boot"]
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert scheduler.capacity().vms_in_use == 1  # only the refilled pooled VM


async def test_a_pool_whose_vms_keep_failing_makes_wait_pool_ready_raise(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "_RETRY_FIRST_SECONDS", 0.01)
    vms = StandInVms(tmp_path / "stand-in", boot_modes=["exit"] * 10)
    async with stand_in_scheduler(tmp_path, vms, warm_pool_size={"python": 1}) as (scheduler, _):
        with pytest.raises(VmTransientError, match="failed 3 times in a row"):
            await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert scheduler.capacity().vms_in_use == 0  # no failed start kept its ticket


class _RecordingVms(StandInVms):
    """Stand-ins that also record each boot's RAM and template digest."""

    booted: list[tuple[int, str | None]]

    async def boot(self, spec: VmSpec, *, registry: VmRegistry, **options: object) -> object:  # type: ignore[override]
        self.booted.append(
            (spec.memory_mb, None if spec.template is None else spec.template.digest)
        )
        return await super().boot(spec, registry=registry, **options)  # type: ignore[arg-type]


async def _publish_template(root: Path, name: str, memory_mb: int) -> Template:
    """A template record and image in the store at root (the image is not one: stand-ins never
    read it)."""
    data = b"GUEST STAND-IN: not a template image\n"
    store = TemplateStore(root, 1 << 30)
    async with store.build_dir() as staging:
        image = staging / "image"
        image.write_bytes(data)
        template = Template(
            name=name,
            digest="sha256:" + hashlib.sha256(data).hexdigest(),
            size_bytes=len(data),
            languages={"raw": "bash"},
            env={},
            workdir="/",
            memory_mb=memory_mb,
        )
        return await store.publish(template, image)


async def test_a_template_pool_serves_runs_of_its_template_only(tmp_path: Path) -> None:
    template = await _publish_template(tmp_path / "templates", "tools", memory_mb=256)
    vms = _RecordingVms(tmp_path / "stand-in")
    vms.booted = []
    async with stand_in_scheduler(tmp_path, vms, warm_pool_size={"tools:raw": 1}) as (
        scheduler,
        _,
    ):
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)
        assert vms.booted == [(256, template.digest)]  # the template's disk and RAM default
        assert scheduler.capacity().warm_pool == {
            "python": 0,
            "javascript": 0,
            "raw": 0,
            "tools:raw": 1,
        }
        plain = await scheduler.run("out plain", language="raw")
        assert plain.stdout == "plain\n" and not plain.warm_pool_hit  # the default image
        own_ram = await scheduler.run("out big", language="raw", template="tools", memory_mb=512)
        assert not own_ram.warm_pool_hit  # not the pooled VMs' RAM
        hit = await scheduler.run("out pooled", language="raw", template="tools")
        assert hit.stdout == "pooled\n" and hit.warm_pool_hit
        await scheduler.wait_pool_ready(HANG_GUARD_SECONDS)  # the refill replaced it
        assert vms.booted == [
            (256, template.digest),
            (192, None),
            (512, template.digest),
            (256, template.digest),
        ]
