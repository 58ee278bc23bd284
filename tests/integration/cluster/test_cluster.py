"""ClusterScheduler on a local two-host Ray cluster (conftest.py): placement, streaming,
sessions reachable from another client process, large files through the object store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from exec_sandbox.cluster import ClusterScheduler

from .conftest import LocalCluster

pytestmark = [pytest.mark.vm, pytest.mark.cluster]


async def test_runs_spread_over_both_hosts_when_one_is_full(client: ClusterScheduler) -> None:
    # Each host admits one VM: two runs at once fit only if the second goes to the other host
    # (a client that kept to one host would queue it there: one host would count both).
    before = {h.name: h.runs for h in await client.hosts()}
    results = await asyncio.gather(
        *(client.run("import time; time.sleep(2); print('done')") for _ in range(2))
    )
    assert [r.stdout for r in results] == ["done\n", "done\n"]
    after = {h.name: h.runs for h in await client.hosts()}
    assert len(after) == 2
    assert {name: after[name] - before[name] for name in after} == dict.fromkeys(after, 1)


async def test_run_streams_output_to_the_callback_across_the_actor_boundary(
    client: ClusterScheduler,
) -> None:
    chunks: list[str] = []
    result = await client.run(
        "import sys, time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')",
        on_stdout=chunks.append,
    )
    assert result.exit_code == 0
    assert "".join(chunks) == result.stdout == "first\nsecond\n"


async def test_run_results_and_errors_match_the_local_scheduler(client: ClusterScheduler) -> None:
    result = await client.run("import sys; print('x'); sys.exit(3)")
    assert (result.stdout, result.exit_code) == ("x\n", 3)
    assert result.timing.total_ms > 0
    from exec_sandbox import CodeValidationError

    with pytest.raises(CodeValidationError):
        await client.run("print(1)", language="cobol")  # type: ignore[arg-type]


async def test_session_keeps_state_and_is_reachable_from_a_second_client(
    client: ClusterScheduler, shared_cluster: LocalCluster
) -> None:
    async with await client.session() as session:
        await session.exec("x = 41")
        # Another process: its own Ray driver, attaching by the session id alone.
        script = textwrap.dedent(f"""
            import asyncio
            from exec_sandbox.cluster import ClusterScheduler

            async def main():
                async with ClusterScheduler(address={shared_cluster.cluster.address!r}) as other:
                    attached = await other.attach({session.session_id!r})
                    result = await attached.exec("print(x + 1); y = 'from the second client'")
                    print(result.stdout, end="")

            asyncio.run(main())
        """)
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout == "42\n"
        # The second client's disconnect left the session open, with its change in it.
        result = await session.exec("print(y)")
        assert result.stdout == "from the second client\n"
        assert session.exec_count == 3


async def test_20_mb_file_round_trip_through_the_object_store(client: ClusterScheduler) -> None:
    data = os.urandom(20 << 20)
    async with await client.session() as session:
        await session.write_file("data/blob.bin", data)
        listed = await session.list_files("data")
        assert [(f.name, f.size) for f in listed] == [("blob.bin", len(data))]
        result = await session.exec(
            "import hashlib; print(hashlib.sha256(open('data/blob.bin', 'rb').read()).hexdigest())"
        )
        import hashlib

        assert result.stdout.strip() == hashlib.sha256(data).hexdigest()
        assert await session.read_file("data/blob.bin") == data


def _sbx(*args: str) -> subprocess.CompletedProcess[str]:
    sbx = os.path.join(os.path.dirname(sys.executable), "sbx")
    return subprocess.run([sbx, *args], capture_output=True, text=True, timeout=180, check=False)


async def test_sbx_run_cluster_runs_the_code_on_a_host(shared_cluster: LocalCluster) -> None:
    out = await asyncio.to_thread(
        _sbx,
        "run",
        "--cluster",
        shared_cluster.cluster.address,
        "-c",
        "import sys; print('on the cluster'); sys.exit(4)",
    )
    assert (out.stdout, out.returncode) == ("on the cluster\n", 4), out.stderr[-2000:]


async def test_sbx_doctor_cluster_reports_each_hosts_layers_and_capacity(
    shared_cluster: LocalCluster,
) -> None:
    out = await asyncio.to_thread(
        _sbx, "doctor", "--cluster", shared_cluster.cluster.address, "--json"
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    import json

    reports = json.loads(out.stdout)
    assert len(reports) == 2
    for report in reports:
        assert report["info"]["capacity"]["max_vms"] == 1
        assert {"accelerator", "qemu", "images"} <= {c["name"] for c in report["checks"]}


async def test_a_paused_session_is_listed_resumed_and_deleted_through_the_cluster(
    client: ClusterScheduler,
) -> None:
    async with await client.session() as session:
        await session.exec("x = 41")
        snapshot = await session.pause()
    assert snapshot.id in {s.id for s in await client.snapshots()}
    async with await client.resume(snapshot) as resumed:
        assert (await resumed.exec("print(x + 1)")).stdout == "42\n"
    assert await client.delete_snapshot(snapshot) is True
    assert snapshot.id not in {s.id for s in await client.snapshots()}
    assert await client.delete_snapshot(snapshot.id) is False
