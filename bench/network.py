"""Network by name, in one run on this machine:

1. connect latency: guest code looks a name up, connects and reads the first byte a host
   loopback server sends on accept, against the same from a host process (which connects to an
   address); connect-to-first-byte (the issue's measure) and the lookup are timed apart;
2. bulk throughput, host -> guest (download) and guest -> host (upload), against the same
   transfer between two host processes;
3. the C/io_uring relay against a plain asyncio relay (bench/net_asyncio_relay.py) on the same
   VMs' workload: throughput, and the bench process's CPU time per MB moved (the relay and the
   event loop; the servers run in a child process so that their CPU is not counted);
4. what a virtio-serial port itself carries here, the ceiling of any relay over one: the same
   bytes each way as session file I/O on the agent channel (write_file: host -> guest,
   read_file: guest -> host; 60 KiB frames, like the relay's DATA);
   like against like, twice: the first transfer each way in a fresh VM, and a later one. Under
   TCG the first use of a code path in a VM's QEMU process pays for its translation (the
   translated code is not part of a memory snapshot): a fresh VM's first download through the
   guest's TCP costs about twice the QEMU CPU per MB of the next one, the port's first about
   1.4 times (docs/benchmarks.md). The relay's first figures come from the client below, its
   later ones from the one-direction runs after it; the port's from two transfers each way;
5. what the guest costs: the CPU time of the session's QEMU process (all threads: the emulated
   vCPU and QEMU's I/O) per MB moved, per direction (a download alone, an upload alone, after
   the client above), for the relay and for the port's own transfer. Under TCG the vCPU is often
   the bottleneck, and this figure moves much less with the host's load than MB/s does.

Every VM gets the same memory (VM_MEMORY_MB); one unmeasured round runs first, and the L1
snapshot builds it starts are waited for before the measured rounds.

    .venv/bin/python bench/network.py --mb 64 --connects 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from net_asyncio_relay import AsyncioHub

from exec_sandbox import Scheduler, SchedulerConfig

CHUNK = b"x" * 65536
# Every VM of the bench, relay's and port's alike: the port's needs room for the blob in its
# tmpfs, and the guest's memory size moves the relay's MB/s too (192 against 512 MiB: about
# -10 % down, measured alternated), so both sides get the same.
VM_MEMORY_MB = 512


def vm_cpu_seconds(session: object) -> float:
    """CPU time so far of the session's QEMU process (all its threads)."""
    with open(f"/proc/{session.vm.pid}/stat") as f:  # type: ignore[attr-defined]
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _servers(ready: multiprocessing.connection.Connection, total: int) -> None:
    """Child process: first-byte, download and upload servers on 127.0.0.1."""

    def first_byte(conn: socket.socket) -> None:
        conn.sendall(b"!")
        conn.close()

    def download(conn: socket.socket) -> None:
        left = total
        while left > 0:
            conn.sendall(CHUNK[: min(left, len(CHUNK))])
            left -= len(CHUNK)
        conn.close()

    def upload(conn: socket.socket) -> None:
        got = 0
        while data := conn.recv(262144):
            got += len(data)
        conn.sendall(str(got).encode())
        conn.close()

    ports = []
    for handler in (first_byte, download, upload):
        lsock = socket.create_server(("127.0.0.1", 0), backlog=128)
        ports.append(lsock.getsockname()[1])

        def loop(lsock: socket.socket = lsock, handler=handler) -> None:  # type: ignore[no-untyped-def]
            while True:
                conn, _ = lsock.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=handler, args=(conn,), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
    ready.send(ports)
    threading.Event().wait()


def start_servers(total: int) -> tuple[multiprocessing.Process, list[int]]:
    """_servers in a child process (its CPU is not the bench's): the process and the ports of
    its first-byte, download and upload servers."""
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=_servers, args=(child, total), daemon=True)
    proc.start()
    return proc, parent.recv()


# The bulk transfers, one definition for the host's client, the VM's and the one-direction runs.
# Every byte read into one reused buffer: recv(262144) would allocate 256 KiB per call, above
# glibc's mmap threshold, i.e. 50-70 fresh pages (page faults) per MB in the guest.
TRANSFERS = """
import socket, time
def download(host, port):
    into = memoryview(bytearray(262144))
    t = time.perf_counter(); s = socket.create_connection((host, port)); n = 0
    while True:
        k = s.recv_into(into)
        if not k: break
        n += k
    s.close()
    return n, n / (time.perf_counter() - t) / 1e6
def upload(host, port, total):
    buf = b"y" * 65536
    t = time.perf_counter(); s = socket.create_connection((host, port)); left = total
    while left > 0:
        s.sendall(buf[: min(left, len(buf))]); left -= len(buf)
    s.shutdown(socket.SHUT_WR); got = int(s.recv(64)); s.close()
    return got, got / (time.perf_counter() - t) / 1e6
"""
CLIENT = (
    TRANSFERS
    + """
import json, sys
host, ports, total, connects = sys.argv[1] if len(sys.argv) > 1 else HOST, PORTS, TOTAL, CONNECTS
lat, lookups = [], []
for _ in range(connects):
    # The name's lookup on its own (in a VM: glibc asking the agent's DNS stub; on the host the
    # address is given), then the connect latency: connect to first byte.
    t = time.perf_counter()
    family, kind, proto, _, address = socket.getaddrinfo(host, ports[0], type=socket.SOCK_STREAM)[0]
    looked_up = time.perf_counter()
    s = socket.socket(family, kind, proto); s.connect(address); s.recv(1); s.close()
    lat.append((time.perf_counter() - looked_up) * 1000)
    lookups.append((looked_up - t) * 1000)
n, down = download(host, ports[1])
got, up = upload(host, ports[2], total)
lat.sort(); lookups.sort()
print(json.dumps({"connect_p50_ms": lat[len(lat) // 2], "connect_p90_ms": lat[int(len(lat) * 0.9)],
                  "lookup_p50_ms": lookups[len(lookups) // 2],
                  "down_MBps": down, "up_MBps": up, "bytes": [n, got]}))
"""
)


# One direction alone, after CLIENT (the VM's later transfers): its MB/s, and the VM's CPU per
# MB (the connects of CLIENT would weigh in otherwise).
DOWN_ONLY = TRANSFERS + "print(download(HOST, PORTS[1])[1])\n"
UP_ONLY = TRANSFERS + "print(upload(HOST, PORTS[2], TOTAL)[1])\n"


def client_code(host: str, ports: list[int], total: int, connects: int) -> str:
    return f"HOST, PORTS, TOTAL, CONNECTS = {host!r}, {ports!r}, {total}, {connects}\n" + CLIENT


async def in_guest(
    sched: Scheduler, ports: list[int], total: int, connects: int
) -> tuple[dict[str, float], float]:
    """The client in a VM through the relay: its figures, and the bench process's CPU seconds
    while it ran (relay + loop)."""
    session = await sched.session(
        allow_network=True,
        timeout_seconds=300,
        memory_mb=VM_MEMORY_MB,
        allowed_domains=["bench.test", "bench.test:81", "bench.test:82"],
    )
    async with session:
        code = client_code("bench.test", [80, 81, 82], total, connects)
        cpu = time.process_time()
        result = await session.exec(code)
        cpu = time.process_time() - cpu
        assert result.exit_code == 0, result.stderr
        figures = json.loads(result.stdout)
        for way, body in (("down", DOWN_ONLY), ("up", UP_ONLY)):
            vm_cpu = vm_cpu_seconds(session)
            done = await session.exec(
                f"HOST, PORTS, TOTAL = 'bench.test', [80, 81, 82], {total}\n" + body
            )
            assert done.exit_code == 0, done.stderr
            vm_cpu = vm_cpu_seconds(session) - vm_cpu
            figures[f"vm_{way}_ms_per_MB"] = vm_cpu * 1000 / (total / 1e6)
            figures[f"{way}_later_MBps"] = float(done.stdout)
    return figures, cpu


async def port_ceiling(sched: Scheduler, total: int) -> dict[str, float]:
    """File I/O of total bytes each way over the agent channel's virtio-serial port: the first
    transfer of each direction in a fresh VM (down_MBps, then up_MBps, as the relay's client
    has them: its upload comes after its download), then a later one each way (*_later_MBps,
    and the VM's CPU per MB from those, as for the relay)."""
    mb = total / 1e6
    async with await sched.session(timeout_seconds=300, memory_mb=VM_MEMORY_MB) as session:

        async def timed(transfer: Awaitable[Any]) -> tuple[Any, float, float]:
            """The transfer's result, its MB/s, and the VM's CPU ms per MB during it."""
            at, vm_cpu = time.monotonic(), vm_cpu_seconds(session)
            result = await transfer
            elapsed, vm = time.monotonic() - at, vm_cpu_seconds(session) - vm_cpu
            return result, mb / elapsed, vm * 1000 / mb

        _, down, _ = await timed(session.write_file("blob", b"x" * total))
        data, up, _ = await timed(session.read_file("blob"))
        assert data is not None and len(data) == total
        data, up_later, vm_up = await timed(session.read_file("blob"))
        assert data is not None and len(data) == total
        await session.exec("import os; os.remove('/home/user/blob')")  # room in the guest's tmpfs
        _, down_later, vm_down = await timed(session.write_file("blob", data))
    return {
        "down_MBps": down,
        "up_MBps": up,
        "down_later_MBps": down_later,
        "up_later_MBps": up_later,
        "vm_down_ms_per_MB": vm_down,
        "vm_up_ms_per_MB": vm_up,
    }


def on_host(ports: list[int], total: int, connects: int) -> dict[str, float]:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", client_code("127.0.0.1", ports, total, connects)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="MB each way per transfer")
    ap.add_argument("--connects", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    total = args.mb << 20
    proc, ports = start_servers(total)
    hosts = {
        "bench.test:80": f"127.0.0.1:{ports[0]}",
        "bench.test:81": f"127.0.0.1:{ports[1]}",
        "bench.test:82": f"127.0.0.1:{ports[2]}",
    }
    rows: dict[str, list[dict[str, float]]] = {
        "host": [],
        "c-io_uring": [],
        "asyncio": [],
        "port": [],
    }
    with tempfile.TemporaryDirectory() as cache:
        config = SchedulerConfig(
            max_concurrent_vms=2, memory_snapshot_cache_dir=Path(cache), network_test_hosts=hosts
        )
        async with Scheduler(config) as c_sched, Scheduler(config) as a_sched:
            a_sched._network_hub = AsyncioHub()  # type: ignore[assignment]  # the baseline
            # One unmeasured round first, then the memory snapshots it started are waited for: a
            # build (a VM booting, its RAM digested) running beside a measured round took host
            # CPU from it, the relay's two hops more than the port's one.
            for sched in (c_sched, a_sched):
                await in_guest(sched, ports, total, 1)
            await port_ceiling(c_sched, total)
            for sched in (c_sched, a_sched):
                await sched.wait_snapshots(300)
            for r in range(args.rounds):  # interleaved: every side sees the same host load
                rows["host"].append(on_host(ports, total, args.connects))
                for name, sched in (("c-io_uring", c_sched), ("asyncio", a_sched)):
                    figures, cpu = await in_guest(sched, ports, total, args.connects)
                    figures["cpu_ms_per_MB"] = cpu * 1000 / (2 * total / 1e6)
                    rows[name].append(figures)
                rows["port"].append(await port_ceiling(c_sched, total))
                print(
                    f"round {r + 1}: " + json.dumps({k: v[-1] for k, v in rows.items()}),
                    file=sys.stderr,
                )
            a_sched._network_hub = None
    proc.kill()
    print(
        f"{'':12} {'connect p50':>12} {'p90':>8} {'down MB/s':>10} {'up MB/s':>8} {'CPU ms/MB':>10}"
        f" {'VM ms/MB down':>14} {'up':>6} {'later down':>11} {'up':>7}"
    )
    for name, results in rows.items():

        def med(key: str, results: list[dict[str, float]] = results) -> float:
            return statistics.median(r[key] for r in results)

        cpu = f"{med('cpu_ms_per_MB'):10.2f}" if "cpu_ms_per_MB" in results[0] else f"{'-':>10}"
        connect = (
            f"{med('connect_p50_ms'):10.2f}ms {med('connect_p90_ms'):6.2f}ms"
            if "connect_p50_ms" in results[0]
            else f"{'-':>12} {'-':>8}"
        )
        vm = (
            f"{med('vm_down_ms_per_MB'):14.2f} {med('vm_up_ms_per_MB'):6.2f}"
            if "vm_down_ms_per_MB" in results[0]
            else f"{'-':>14} {'-':>6}"
        )
        later = (
            f"{med('down_later_MBps'):11.1f} {med('up_later_MBps'):7.1f}"
            if "down_later_MBps" in results[0]
            else f"{'-':>11} {'-':>7}"
        )
        print(
            f"{name:12} {connect} {med('down_MBps'):10.1f} {med('up_MBps'):8.1f} {cpu} {vm} {later}"
        )
    # Median of the per-round ratios: relay and port of a round share the host's load.
    for label, keys in (
        ("first transfer of a fresh VM", ("down_MBps", "up_MBps")),
        ("later transfer", ("down_later_MBps", "up_later_MBps")),
    ):
        ratios = {
            k: statistics.median(
                r[k] / p[k] for r, p in zip(rows["c-io_uring"], rows["port"], strict=True)
            )
            for k in keys
        }
        print(
            f"relay / port, {label}: "
            + ", ".join(f"{k.split('_')[0]} {v:.2f}" for k, v in ratios.items())
            + "  (target >= 0.80)"
        )
    first_byte = {
        k: statistics.median(r["connect_p50_ms"] for r in rows[k]) for k in ("host", "c-io_uring")
    }
    lookup = {
        k: statistics.median(r["lookup_p50_ms"] for r in rows[k]) for k in ("host", "c-io_uring")
    }
    print(
        f"first byte after connect, relay - host: {first_byte['c-io_uring'] - first_byte['host']:.2f} ms"  # noqa: E501
        "  (target <= 5 ms)"
    )
    print(
        f"name lookup before it (p50): relay {lookup['c-io_uring']:.2f} ms, host {lookup['host']:.2f} ms;"  # noqa: E501
        f" both together, relay - host: {first_byte['c-io_uring'] + lookup['c-io_uring'] - first_byte['host'] - lookup['host']:.2f} ms"  # noqa: E501
    )


if __name__ == "__main__":
    asyncio.run(main())
