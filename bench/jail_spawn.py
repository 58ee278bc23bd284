"""What the host jail costs at spawn: the C core starting a stand-in for QEMU (/bin/true) with and
without the jail (seccomp build + load, clone into namespaces, mounts, cgroup create/place/read/
remove), measured alternately in the same run. The jail's cost is fixed per VM; compare it with a
VM's boot (bench/cold_run.py).

    .venv/bin/python bench/jail_spawn.py --runs 50
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile

from exec_sandbox import _execsbx
from exec_sandbox.vm.jail import jail_options

ARGS = dict(qemu_binary="/bin/true", kernel="k", rootfs="r", memory_mb=128)


def spawn_and_close(jail: dict[str, int] | None) -> float:
    start = time.perf_counter()
    vm = _execsbx.Vm(**ARGS, jail=jail)
    vm.wait_spawn()
    while vm.poll_exit() is None:
        time.sleep(0.0005)
    vm.close()
    return (time.perf_counter() - start) * 1000


def main(runs: int) -> None:
    plain: list[float] = []
    jailed: list[float] = []
    options = jail_options(128)
    for _ in range(runs):  # alternate, so that load on the shared host hits both alike
        plain.append(spawn_and_close(None))
        jailed.append(spawn_and_close(options))
    for name, values in (("no jail", plain), ("jail", jailed)):
        print(
            f"{name:8} p50 {percentile(values, 50):7.2f} ms   p90 {percentile(values, 90):7.2f} ms"
        )
    ratio = percentile(jailed, 50) / percentile(plain, 50)
    print(
        f"jail / no jail (p50): {ratio:.2f}x, "
        f"+{percentile(jailed, 50) - percentile(plain, 50):.2f} ms per VM"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    main(parser.parse_args().runs)
