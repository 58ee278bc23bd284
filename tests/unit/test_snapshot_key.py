"""The L1 snapshot cache key covers everything that changes a restored VM."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from exec_sandbox.images.catalog import GuestImages
from exec_sandbox.snapshots.l1 import snapshot_key
from exec_sandbox.vm import host_facts
from exec_sandbox.vm.spec import VmSpec


def test_every_input_changes_the_key() -> None:
    images = GuestImages(Path("/k"), Path("/r"), kernel_hash="k1", rootfs_hash="r1")
    spec = VmSpec(qemu_binary=host_facts.qemu_binary(), images=images, accel="tcg", memory_mb=192)
    base = snapshot_key(spec, "python")
    assert snapshot_key(spec, "python") == base
    variants = [
        snapshot_key(spec, "javascript"),
        snapshot_key(replace(spec, memory_mb=256), "python"),
        snapshot_key(replace(spec, vcpus=2), "python"),
        snapshot_key(replace(spec, accel="kvm"), "python"),
        snapshot_key(replace(spec, kernel_cmdline_extra="tsc_early_khz=1"), "python"),
        snapshot_key(replace(spec, images=replace(images, kernel_hash="k2")), "python"),
        snapshot_key(replace(spec, images=replace(images, rootfs_hash="r2")), "python"),
        # The network port is part of the device layout: network VMs have their own snapshots.
        snapshot_key(replace(spec, net_port=True), "python"),
    ]
    assert len(set(variants)) == len(variants) and base not in variants
    # The paths of the images do not matter, their content hashes do.
    moved = replace(images, kernel=Path("/elsewhere/k"))
    assert snapshot_key(replace(spec, images=moved), "python") == base


def test_tsc_measurement_jitter_keeps_the_key() -> None:
    # Each process measures the host TSC; its last digit varies between processes. The same
    # host must keep its snapshots across processes (`sbx run` is one process per call), while
    # another host's TSC (other MHz) still makes another key.
    images = GuestImages(Path("/k"), Path("/r"), kernel_hash="k1", rootfs_hash="r1")
    spec = VmSpec(qemu_binary=host_facts.qemu_binary(), images=images, accel="tcg", memory_mb=192)

    def key(cmdline: str) -> str:
        return snapshot_key(replace(spec, kernel_cmdline_extra=cmdline), "python")

    assert key("tsc_early_khz=2596139") == key("tsc_early_khz=2596140")
    assert key("tsc_early_khz=2596140") != key("tsc_early_khz=2597140")
    assert key("tsc_early_khz=2596140") != key("")
