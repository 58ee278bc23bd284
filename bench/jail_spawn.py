"""What the host jail costs at spawn: the C core starting a stand-in for QEMU (/bin/true) with no
jail, with the jail as it was (deny-list seccomp, the host's tree read-only, QEMU keeping the
caller's uid) and with today's (allow-list seccomp, a root of its own holding QEMU's ~60 files,
an unprivileged uid without capabilities when the caller is root), measured alternately in the
same run. Each includes the seccomp load, the clone into namespaces, the mounts, the cgroup's
create/place/read/remove and the reap. The jail's cost is fixed per VM; compare it with a VM's boot
(bench/cold_run.py).

    .venv/bin/python bench/jail_spawn.py --runs 50
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile

from exec_sandbox import _execsbx
from exec_sandbox.vm import host_facts
from exec_sandbox.vm.jail import jail_options, root_files

STAND_IN = "/bin/true"
# The jail opens the images itself: /dev/null stands in for them.
ARGS = dict(qemu_binary=STAND_IN, kernel="/dev/null", rootfs="/dev/null", memory_mb=128)


def spawn_and_close(jail: dict[str, Any] | None) -> float:
    start = time.perf_counter()
    vm = _execsbx.Vm(**ARGS, jail=jail)
    vm.wait_spawn()
    while vm.poll_exit() is None:
        time.sleep(0.0005)
    status = vm.poll_exit()
    vm.close()
    if status != 0:
        raise SystemExit(f"the stand-in exited with {status}: {vm.jail_status()}")
    return (time.perf_counter() - start) * 1000


def main(runs: int) -> None:
    qemu = host_facts.qemu_binary()
    tight = jail_options(128, qemu_binary=STAND_IN, seccomp="allow")
    # QEMU's root (its binary, libraries, module, firmware, devices) plus the stand-in's own:
    # as many mounts as a real VM's root.
    tight["root"] = sorted({*(root_files(qemu) or ()), *(root_files(STAND_IN) or ())})
    old = {k: v for k, v in tight.items() if k not in ("uid", "gid", "groups", "root")}
    old["seccomp"] = "deny"
    series: dict[str, list[float]] = {"no jail": [], "old jail": [], "new jail": []}
    for _ in range(runs):  # alternate, so that load on the shared host hits all alike
        series["no jail"].append(spawn_and_close(None))
        series["old jail"].append(spawn_and_close(old))
        series["new jail"].append(spawn_and_close(tight))
    print(
        f"root of {len(tight['root'])} files, uid {tight.get('uid', os.geteuid())}, "
        f"{runs} runs each"
    )
    for name, values in series.items():
        print(
            f"{name:8} p50 {percentile(values, 50):7.2f} ms   p90 {percentile(values, 90):7.2f} ms"
        )
    p50 = {name: percentile(values, 50) for name, values in series.items()}
    print(
        f"old jail / no jail (p50): {p50['old jail'] / p50['no jail']:.2f}x, "
        f"+{p50['old jail'] - p50['no jail']:.2f} ms per VM"
    )
    print(
        f"new jail / old jail (p50): {p50['new jail'] / p50['old jail']:.2f}x, "
        f"+{p50['new jail'] - p50['old jail']:.2f} ms per VM"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    main(parser.parse_args().runs)
