"""check_machine (snapshots/forks.py): a paused session's saved machine against the one a resume
would start, through a Scheduler whose VMs are GUEST STAND-INS (only its provisioner's spec is
used here; no VM starts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from exec_sandbox import SnapshotError
from exec_sandbox.snapshots.forks import check_machine
from exec_sandbox.snapshots.identity import machine_identity
from tests.unit.guest_stand_in import stand_in_scheduler


async def test_a_saved_network_port_the_resumed_machine_lacks_is_a_difference(
    tmp_path: Path,
) -> None:
    # The resumed spec is made from the snapshot's metadata, which has no network: loading a
    # state whose network device is missing would end QEMU with a bare QMP error instead.
    async with stand_in_scheduler(tmp_path) as (scheduler, _):
        spec = scheduler._provisioner.spec(scheduler.config.default_memory_mb)
        check_machine({"id": "same", "machine": machine_identity(spec)}, spec)
        saved = machine_identity(replace(spec, net_port=True))
        with pytest.raises(SnapshotError, match="net_port differ"):
            check_machine({"id": "networked", "machine": saved}, spec)
