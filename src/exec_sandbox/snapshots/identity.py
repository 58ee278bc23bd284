"""What a saved VM state can only be loaded into the same of (`machine_identity`): part of the L1
snapshot keys (l1.py), of paused sessions' metadata (sessions.py) and of node's startup blob's
key (node_startup.py)."""

from __future__ import annotations

import functools
import re
import subprocess

from ..vm.spec import VmSpec

_TSC_KHZ = re.compile(r"\btsc_early_khz=([0-9]{1,12})\b")


@functools.cache
def qemu_version(qemu_binary: str) -> str:
    """`qemu --version`'s first line: a QEMU upgrade makes every snapshot stale."""
    out = subprocess.run(
        [qemu_binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return (out.stdout.strip().splitlines() or ["unknown"])[0]


def machine_identity(spec: VmSpec) -> dict[str, object]:
    """What a saved VM state can only be loaded into the same of: images, QEMU, accelerator,
    RAM size, vCPUs, kernel command line, template (part of L1 keys and of paused sessions'
    metadata)."""
    return {
        "kernel": spec.images.kernel_hash,
        "rootfs": spec.images.rootfs_hash,
        "qemu": qemu_version(spec.qemu_binary),
        "accel": spec.accel,
        "memory_mb": spec.memory_mb,
        "vcpus": spec.vcpus,
        "cmdline": _stable_cmdline(spec.kernel_cmdline_extra),
        # The network port changes the device layout (kept out of plain VMs' keys: unchanged).
        **({"net_port": True} if spec.net_port else {}),
        # A template's disk is the root its processes run in: another one (a rebuilt template
        # of the same name) must never get this state.
        **({"template": spec.template.digest} if spec.template is not None else {}),
        # The work disk: another size is another device, and another file system in the
        # guest's memory (kept out of disk-less VMs' identity: a template builder's).
        **({"disk_mb": spec.disk_mb} if spec.disk_mb else {}),
    }


def _stable_cmdline(cmdline: str) -> str:
    """The command line as far as it makes restored VMs differ. The host TSC frequency is
    measured by each process and its last digit jitters (2596139 vs 2596140 kHz here), which
    would give another key (a snapshot miss, and one more directory) to every other process:
    the key has it in MHz. A template booted with the other reading is as good: the difference
    is under a ppm, and a clone's clock is set at RESEED anyway."""
    return _TSC_KHZ.sub(lambda m: f"tsc_early_mhz={round(int(m.group(1)) / 1000)}", cmdline)
