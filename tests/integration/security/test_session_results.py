"""A session's results belong to their exec: user code that writes
completion lines to the REPL driver's control fd neither ends its exec nor shifts output into the
next one, and output of background processes of one exec never reaches a later result."""

from __future__ import annotations

import pytest

from exec_sandbox import Scheduler

pytestmark = pytest.mark.vm

# Every fd the code has, every plausible request number, the old one-number format and a line
# left unfinished: what a program that wants to end its exec early can write.
FORGE = {
    "python": """
import os, time
for fd in map(int, os.listdir('/proc/self/fd')):
    if fd > 2:
        for line in [b'0\\n'] + [b'%d 0\\n' % seq for seq in range(64)] + [b'zz']:
            try:
                os.write(fd, line)
            except OSError:
                pass
time.sleep(1)
print('late')
raise SystemExit(3)
""",
    # The driver's control fds only, fd 4 of a driver the agent started or fd 3 (one socket, in
    # and out) of a pre-started node that became the driver: other fds of node are libuv's own.
    "javascript": """
const fs = require('fs');
for (const fd of [3, 4]) {
  for (const line of ['0\\n', ...Array.from({length: 64}, (_, s) => `${s} 0\\n`), 'zz']) {
    try { fs.writeSync(fd, line); } catch (e) { /* not this driver's control fd */ }
  }
}
await new Promise((resolve) => setTimeout(resolve, 1000));
console.log('late');
process.exit(3);
""",
    # bash keeps the control fd of the driver saved at a high fd while the code is sourced.
    "raw": """
for f in /proc/$$/fd/*; do
  n=${f##*/}
  [ "$n" -gt 2 ] || continue
  { printf '0\\n'; for s in $(seq 0 63); do printf '%d 0\\n' "$s"; done; printf zz; } >&"$n"
done 2>/dev/null
sleep 1
echo late
(exit 3)
""",
}
SET_STATE = {"python": "kept = 1", "javascript": "var kept = 1", "raw": "kept=1"}
READ_STATE = {
    "python": "print('next', kept)",
    "javascript": "console.log('next', kept)",
    "raw": 'echo next "$kept"',
}


@pytest.mark.parametrize("language", ["python", "javascript", "raw"])
async def test_forged_completion_neither_ends_the_exec_nor_shifts_its_output(
    scheduler: Scheduler, language: str
) -> None:
    async with await scheduler.session(language=language) as session:
        await session.exec(SET_STATE[language])
        forged = await session.exec(FORGE[language], timeout_seconds=60)
        assert (forged.exit_code, forged.stdout) == (3, "late\n"), forged
        after = await session.exec(READ_STATE[language], timeout_seconds=60)
        assert (after.exit_code, after.stdout, after.stderr) == (0, "next 1\n", ""), after


async def test_background_process_output_never_reaches_a_later_exec(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        started = await session.exec(
            "(for i in $(seq 1 60); do echo GHOST $i; echo GHOSTERR $i >&2; sleep 0.1; done) &"
            " echo started"
        )
        assert started.stdout.startswith("started\n"), started
        later = await session.exec("sleep 3; echo clean", timeout_seconds=60)
        assert (later.stdout, later.stderr) == ("clean\n", ""), later


async def test_python_subprocess_output_stays_in_its_exec(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        await session.exec(
            "import subprocess\n"
            "p = subprocess.Popen(['sh', '-c', 'for i in $(seq 1 60); do echo GHOST $i;"
            " sleep 0.1; done'])\nprint('started')"
        )
        later = await session.exec("import time; time.sleep(3); print('clean')", timeout_seconds=60)
        assert (later.stdout, later.stderr) == ("clean\n", ""), later


async def test_fork_bomb_messages_stay_in_the_exec_that_started_it(scheduler: Scheduler) -> None:
    # A fork bomb left running in the background: bash's "fork: retry" messages of its
    # processes must not appear in the next exec's stderr.
    async with await scheduler.session(language="python") as session:
        await session.exec(
            "import subprocess, time\n"
            "subprocess.Popen(['bash', '-c', 'b() { b | b & }; b'])\n"
            "time.sleep(2)\nprint('launched')",
            timeout_seconds=60,
        )
        later = await session.exec("import time; time.sleep(4); print('after')", timeout_seconds=60)
        assert (later.stdout, later.stderr) == ("after\n", ""), later


# What the code leaves running inside the REPL (a python thread, a node Worker, a bash subshell)
# writes completion lines for the next requests to the driver's control fds for seconds. Between
# reading a request's line and opening its FIFOs, and between releasing them and its report, the
# driver holds no FIFO: only what such a writer cannot know (the request's nonce) keeps its lines
# from completing a later exec.
SPAMMER = {
    "python": """
import os, threading, time
def spam():
    end = time.time() + 10
    while time.time() < end:
        for fd in map(int, os.listdir('/proc/self/fd')):
            if fd > 2:
                for s in range(1, 24):
                    try:
                        os.write(fd, b'\\n%d 0\\n' % s)
                    except OSError:
                        pass
threading.Thread(target=spam, daemon=True).start()
""",
    "javascript": """
const { Worker } = require('worker_threads');
new Worker(`const fs = require('fs'); const end = Date.now() + 10000;
while (Date.now() < end) {
  for (const fd of [3, 4]) for (let s = 1; s < 24; s++) {
    try { fs.writeSync(fd, '\\\\n' + s + ' 0\\\\n'); } catch (e) { /* not a control fd */ }
  }
}`, { eval: true }).unref();
""",
    "raw": """
( end=$((SECONDS + 10)); while [ $SECONDS -lt $end ]; do
    for f in /proc/$BASHPID/fd/*; do
      n=${f##*/}; [ "$n" -gt 2 ] || continue
      for s in $(seq 1 24); do printf '\\n%d 0\\n' "$s"; done >&"$n"
    done 2>/dev/null
  done ) >/dev/null 2>&1 &
""",
}
SLOW_EXIT_3 = {
    "python": "import time; time.sleep(0.3); print('ok', {i}); raise SystemExit(3)",
    "javascript": (
        "await new Promise((r) => setTimeout(r, 300)); console.log('ok', {i}); process.exit(3);"
    ),
    "raw": "sleep 0.3; echo ok {i}; (exit 3)",
}


@pytest.mark.parametrize("language", ["python", "javascript", "raw"])
async def test_what_the_code_leaves_running_cannot_complete_a_later_exec(
    scheduler: Scheduler, language: str
) -> None:
    async with await scheduler.session(language=language) as session:
        started = await session.exec(SPAMMER[language], timeout_seconds=60)
        assert started.exit_code == 0, started
        results = [
            await session.exec(SLOW_EXIT_3[language].format(i=i), timeout_seconds=60)
            for i in range(12)
        ]
        assert [(r.exit_code, r.stdout) for r in results] == [
            (3, f"ok {i}\n") for i in range(12)
        ], results


# bash writes a line for a job that a signal ended ("line 1:  42 Killed  ( ... )") on its own
# stderr when it notices the job's end: for a job an earlier exec left running, that is during a
# later exec, whose stderr its stderr then is.
@pytest.mark.parametrize("signal", ["KILL", "SEGV", "ABRT", "USR1", "RTMIN+3"])
async def test_bash_reports_no_job_of_an_earlier_exec_in_a_later_one(
    scheduler: Scheduler, signal: str
) -> None:
    async with await scheduler.session(language="raw") as session:
        started = await session.exec(f"(sleep 1; kill -{signal} $BASHPID) & echo started")
        assert (started.stdout, started.stderr) == ("started\n", ""), started
        later = await session.exec("sleep 3; echo clean", timeout_seconds=60)
        assert (later.exit_code, later.stdout, later.stderr) == (0, "clean\n", ""), later


async def test_bash_jobs_of_an_earlier_exec_can_still_be_waited_for(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        await session.exec("sleep 2 & pid=$!; (sleep 1; exit 7) &")
        later = await session.exec('wait %2; echo "$?"; wait "$pid"; echo "$?"', timeout_seconds=60)
        assert (later.exit_code, later.stdout, later.stderr) == (0, "7\n0\n", ""), later
