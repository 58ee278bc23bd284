"""The RESEED message in a real guest: the agent reseeds the kernel RNG, sets the clock from the
host's value and acknowledges. (Restored clones get it before any code runs: see
tests/integration/security/test_snapshot_rng.py.)"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from exec_sandbox.images.catalog import load_images
from exec_sandbox.paths import images_dir
from exec_sandbox.vm import host_facts
from exec_sandbox.vm.execution import ExecRequest
from exec_sandbox.vm.guest import GuestVm
from exec_sandbox.vm.spec import VmSpec

pytestmark = pytest.mark.vm

# 2033-05-18T03:33:20Z
FUTURE_NS = 2_000_000_000 * 1_000_000_000


def _raw(code: bytes) -> ExecRequest:
    return ExecRequest("raw", code, 10_000, [], 4096, 4096)


async def test_reseed_sets_the_guest_clock_and_is_acknowledged(images_ready: None) -> None:
    spec = VmSpec(
        qemu_binary=host_facts.qemu_binary(),
        images=load_images(images_dir()),
        accel=host_facts.accelerator(),
        memory_mb=192,
        kernel_cmdline_extra=f"tsc_early_khz={host_facts.tsc_khz()}",
    )
    vm = await GuestVm.boot(spec, registry=None, boot_timeout=60)
    try:
        with pytest.raises(ValueError, match="seed must be"):
            vm._vm.send_reseed(99, b"short")  # refused before it reaches the guest
        done = asyncio.get_running_loop().create_future()
        vm._acks[7] = done
        vm._want_write(vm._vm.send_reseed(7, os.urandom(64), FUTURE_NS))
        await asyncio.wait_for(done, 10)  # RESEEDED came back with id 7
        assert (await vm.execute(_raw(b"date -u +%Y-%m-%d"))).stdout == "2033-05-18\n"
        await vm.reseed()  # the path restore() takes: the host's clock and fresh bytes
        guest_now = int((await vm.execute(_raw(b"date -u +%s"))).stdout)
        assert abs(guest_now - time.time()) < 30
    finally:
        vm.close()


async def test_reseed_kills_a_waiting_interpreter_that_cannot_refresh_its_generators(
    images_ready: None,
) -> None:
    """A RESEED while a pre-started interpreter waits (a template's, before its save): bash, whose
    $RANDOM was seeded at its start, is killed, and the next run gets a fresh one; python, which
    has nothing to refresh, and node, which refreshes its generators at the go, stay and run the
    code (runner.h, struct sbx_prestarted)."""
    spec = VmSpec(
        qemu_binary=host_facts.qemu_binary(),
        images=load_images(images_dir()),
        accel=host_facts.accelerator(),
        memory_mb=192,
        kernel_cmdline_extra=f"tsc_early_khz={host_facts.tsc_khz()}",
    )
    vm = await GuestVm.boot(spec, registry=None, boot_timeout=60)
    try:
        who = b"head -c 8 /proc/$$/cmdline | tr '\\0' ' '"
        assert await vm.prestart("raw")
        assert (await vm.execute(_raw(who))).stdout == "bash -c "  # served by the waiting one
        assert await vm.prestart("raw")
        await vm.reseed()
        assert (await vm.execute(_raw(who))).stdout == "bash /ru"  # a fresh bash
        assert await vm.prestart("python")
        await vm.reseed()
        argv1 = b"print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode())"
        r = await vm.execute(ExecRequest("python", argv1, 10_000, [], 4096, 4096))
        assert (r.stdout, r.exit_code) == ("-c\n", 0), r
        # node with its addon: stays, and runs the code after refreshing its generators.
        assert await vm.prestart("javascript")
        await vm.reseed()
        preload = (
            b"console.log(require('fs').readFileSync('/proc/self/cmdline', 'latin1')"
            b".split('\\0').includes('-r'))"
        )
        r = await vm.execute(ExecRequest("javascript", preload, 30_000, [], 4096, 4096))
        assert (r.stdout, r.exit_code) == ("true\n", 0), r
    finally:
        vm.close()
