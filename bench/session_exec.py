"""Session benchmarks, each against a host baseline measured in the same run:

* round trip of `session.exec("print(1)")` against the same REPL driver (guest/repl/driver.py)
  run as a plain host process and driven over pipes: the difference is the VM, the agent and the
  channel;
* file transfer MB/s host -> guest (write_file) and guest -> host (read_file) against `cat`
  moving the same bytes through a pipe on the host.

    .venv/bin/python bench/session_exec.py --runs 200 --mb 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary

from exec_sandbox import Scheduler

DRIVER = Path(__file__).resolve().parent.parent / "guest" / "repl" / "driver.py"


class HostRepl:
    """guest/repl/driver.py as a host process: code file + control line in, status line out."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        (run_dir / "session-env").write_bytes(b"")
        ctl_in_r, self.ctl_in_w = os.pipe()
        self.ctl_out_r, ctl_out_w = os.pipe()
        self.out_r, out_w = os.pipe()
        # The shell puts the control pipes on fds 3 and 4, where the driver expects them.
        self.proc = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$0" "$1" 3<&{ctl_in_r} 4>&{ctl_out_w} {ctl_in_r}<&- {ctl_out_w}>&-',
                sys.executable,
                str(DRIVER),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=subprocess.DEVNULL,
            pass_fds=(ctl_in_r, ctl_out_w),
        )
        for fd in (ctl_in_r, ctl_out_w, out_w):
            os.close(fd)

    def exec(self, code: bytes) -> bytes:
        (self.run_dir / "session-code").write_bytes(code)
        os.write(self.ctl_in_w, os.fsencode(self.run_dir) + b"\n")
        status = os.read(self.ctl_out_r, 64)
        assert status == b"0\n", status
        return os.read(self.out_r, 65536)

    def close(self) -> None:
        os.close(self.ctl_in_w)
        self.proc.wait(timeout=10)
        os.close(self.ctl_out_r)
        os.close(self.out_r)


def cat_mb_per_s(data: bytes, tmp: Path) -> tuple[float, float]:
    """(write, read) MB/s of `cat` moving data through a pipe into / out of a file."""
    target = tmp / "cat.bin"
    started = time.perf_counter()
    with target.open("wb") as sink:
        subprocess.run(["cat"], input=data, stdout=sink, check=True)
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    back = subprocess.run(["cat", str(target)], capture_output=True, check=True).stdout
    read_s = time.perf_counter() - started
    assert back == data
    mb = len(data) / 1e6
    return mb / write_s, mb / read_s


async def main(runs: int, megabytes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        async with Scheduler() as scheduler:
            print(f"accelerator: {scheduler.accelerator}\n")
            host = HostRepl(tmp)
            async with await scheduler.session(language="python") as session:
                vm_ms, host_ms = [], []
                for _ in range(runs):
                    started = time.perf_counter()
                    assert host.exec(b"print(1)") == b"1\n"
                    host_ms.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    result = await session.exec("print(1)")
                    vm_ms.append((time.perf_counter() - started) * 1000)
                    assert result.stdout == "1\n"
                host.close()
                ratio = percentile(vm_ms, 50) / percentile(host_ms, 50)
                print('exec("print(1)") round trip')
                print(f"  session          {summary(vm_ms)}")
                print(f"  host REPL (pipe) {summary(host_ms)}")
                print(f"  ratio p50: {ratio:.1f}x\n")

                data = os.urandom(megabytes * 1024 * 1024)
                mb = len(data) / 1e6
                writes, reads, cat_w, cat_r = [], [], [], []
                for _ in range(3):
                    started = time.perf_counter()
                    await session.write_file("bench.bin", data)
                    writes.append(mb / (time.perf_counter() - started))
                    started = time.perf_counter()
                    back = await session.read_file("bench.bin")
                    reads.append(mb / (time.perf_counter() - started))
                    assert back == data
                    w, r = cat_mb_per_s(data, tmp)
                    cat_w.append(w)
                    cat_r.append(r)
                best = max
                print(f"file transfer, {megabytes} MiB, best of 3")
                print(
                    f"  write_file  {best(writes):8.1f} MB/s   host cat into file {best(cat_w):8.1f}"  # noqa: E501
                    f" MB/s   ratio {best(cat_w) / best(writes):.1f}x slower"
                )
                print(
                    f"  read_file   {best(reads):8.1f} MB/s   host cat from file {best(cat_r):8.1f}"
                    f" MB/s   ratio {best(cat_r) / best(reads):.1f}x slower"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--mb", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.mb))
