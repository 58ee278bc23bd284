"""Scheduler.run() end to end in real microVMs: output, exit codes, signals, timeouts, limits."""

from __future__ import annotations

import asyncio
import os

import pytest

from exec_sandbox import OutputLimitError, Scheduler
from exec_sandbox.limits import STDERR_LIMIT_BYTES, STDOUT_LIMIT_BYTES
from exec_sandbox.vm.process import wait_released
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm


async def test_python_prints_and_exits_zero(scheduler: Scheduler) -> None:
    result = await scheduler.run('print("hello", 6 * 7)', language="python")
    assert result.stdout == "hello 42\n"
    assert result.exit_code == 0


async def test_javascript_prints_and_exits_zero(scheduler: Scheduler) -> None:
    result = await scheduler.run(
        "console.log([1, 2, 3].map(x => x * 2).join(','))", language="javascript"
    )
    assert result.stdout == "2,4,6\n"
    assert result.exit_code == 0


async def test_raw_runs_gnu_bash(scheduler: Scheduler) -> None:
    result = await scheduler.run('arr=(a b c); echo "${#arr[@]} $BASH_VERSION"', language="raw")
    count, version = result.stdout.split()
    assert count == "3" and version.startswith("5.")
    assert result.exit_code == 0


async def test_stdout_and_stderr_are_separate(scheduler: Scheduler) -> None:
    result = await scheduler.run("echo out; echo err >&2", language="raw")
    assert (result.stdout, result.stderr) == ("out\n", "err\n")


async def test_nonzero_exit_code_is_returned(scheduler: Scheduler) -> None:
    result = await scheduler.run("import sys; sys.exit(3)")
    assert result.exit_code == 3


async def test_uncaught_exception_is_exit_one_with_traceback(scheduler: Scheduler) -> None:
    result = await scheduler.run("raise ValueError('boom')")
    assert result.exit_code == 1
    assert "ValueError: boom" in result.stderr


async def test_signal_death_is_128_plus_signal(scheduler: Scheduler) -> None:
    result = await scheduler.run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert result.exit_code == 128 + 15


async def test_timeout_returns_minus_one_and_destroys_the_vm(scheduler: Scheduler) -> None:
    result = await scheduler.run("import time; time.sleep(60)", timeout_seconds=1)
    assert result.exit_code == -1
    assert "timed out" in result.stderr
    # run() destroys its VM on the loop's next turn, right after returning (not at close()):
    # killed then, reaped off the loop moments later.
    await asyncio.sleep(0)
    await wait_released()
    assert qemu_processes(parent=os.getpid()) == []


async def test_stdout_over_one_megabyte_raises_output_limit(scheduler: Scheduler) -> None:
    with pytest.raises(OutputLimitError) as info:
        await scheduler.run(
            "import sys\nprint('to stderr', file=sys.stderr, flush=True)\n"
            "for _ in range(40): sys.stdout.write('x' * 32768)"
        )
    # The output up to the limit is kept on the exception.
    assert 0 < len(info.value.stdout) <= STDOUT_LIMIT_BYTES
    assert set(info.value.stdout) == {"x"}
    assert info.value.stderr == "to stderr\n"


async def test_stderr_over_limit_raises_output_limit(scheduler: Scheduler) -> None:
    with pytest.raises(OutputLimitError) as info:
        await scheduler.run(
            "echo before; head -c 200000 /dev/zero | tr '\\0' e >&2", language="raw"
        )
    assert info.value.stdout == "before\n"
    assert 0 < len(info.value.stderr) <= STDERR_LIMIT_BYTES
    assert set(info.value.stderr) == {"e"}


async def test_output_just_under_the_limit_is_returned_whole(scheduler: Scheduler) -> None:
    result = await scheduler.run("import sys; sys.stdout.write('y' * 1_000_000)")
    assert result.stdout == "y" * 1_000_000


async def test_stdin_of_user_code_is_eof(scheduler: Scheduler) -> None:
    result = await scheduler.run("import sys; print(repr(sys.stdin.read()))")
    assert result.stdout == "''\n"


async def test_user_code_runs_as_uid_1000_in_home(scheduler: Scheduler) -> None:
    result = await scheduler.run("id -u; pwd", language="raw")
    assert result.stdout == "1000\n/home/user\n"


async def test_user_code_runs_sched_batch_and_the_agent_does_not(scheduler: Scheduler) -> None:
    # guest/src/spawn.c: user code's wake-ups do not preempt the agent, and what it starts
    # inherits that; the agent's own wake-ups do preempt user code.
    code = (
        "import os, subprocess\n"
        "print(os.sched_getscheduler(1), os.sched_getscheduler(0),"
        " subprocess.run(['python3', '-c', 'import os; print(os.sched_getscheduler(0))'],"
        " capture_output=True, text=True).stdout.strip())"
    )
    result = await scheduler.run(code)
    assert result.exit_code == 0, result.stderr
    assert [int(x) for x in result.stdout.split()] == [
        os.SCHED_OTHER,
        os.SCHED_BATCH,
        os.SCHED_BATCH,
    ]


async def test_env_vars_reach_the_code(scheduler: Scheduler) -> None:
    result = await scheduler.run("echo $GREETING", language="raw", env_vars={"GREETING": "hi"})
    assert result.stdout == "hi\n"


async def test_output_streams_to_callbacks_while_running(scheduler: Scheduler) -> None:
    chunks: list[str] = []
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)"
    result = await scheduler.run(code, on_stdout=chunks.append)
    assert "".join(chunks) == result.stdout == "0\n1\n2\n"
    assert len(chunks) >= 2  # arrived as the code ran, not in one piece at the end


async def test_timing_breakdown_adds_up(scheduler: Scheduler) -> None:
    result = await scheduler.run("print(1)")
    t = result.timing
    # The VM came up either by a cold boot or by restoring an L1 snapshot (boot_ms is 0 then).
    assert (t.boot_ms > 0) != (result.l1_cache_hit and t.restore_ms > 0)
    assert t.execute_ms > 0
    assert t.setup_ms + t.boot_ms + t.execute_ms <= t.total_ms + 2
    assert result.execution_time_ms is not None and result.execution_time_ms <= t.execute_ms


async def test_four_parallel_runs_all_succeed(scheduler: Scheduler) -> None:
    results = await asyncio.gather(*(scheduler.run(f"print({i} * 11)") for i in range(4)))
    assert [r.stdout for r in results] == ["0\n", "11\n", "22\n", "33\n"]
    assert all(r.exit_code == 0 for r in results)


async def test_vcpus_gives_the_guest_that_many_cpus_and_admission_counts_them(
    scheduler: Scheduler,
) -> None:
    code = "import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))"
    assert (await scheduler.run(code, vcpus=2)).stdout == "2 2\n"
    # The first run of a configuration builds its memory snapshot in the background, with
    # vCPUs of its own, and a run's VM is released on the loop's next turn after its result:
    # counted from when no VM is left.
    assert await scheduler.wait_snapshots(120)
    for _ in range(200):
        if scheduler.capacity().vms_in_use == 0:
            break
        await asyncio.sleep(0.05)
    before = scheduler.capacity().free_vcpus
    async with await scheduler.session(language="python", vcpus=3) as session:
        assert (await session.exec(code)).stdout == "3 3\n"
        assert scheduler.capacity().free_vcpus == before - 3
    assert (await scheduler.run(code)).stdout == "1 1\n"
