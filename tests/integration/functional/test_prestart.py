"""Pool hits served by the pre-started interpreter (protocol.h, PRESTART) in real microVMs: the
result is that of a cold one-shot run, and the pre-started process is the one that ran."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from exec_sandbox import ExecutionResult, OutputLimitError, Scheduler, SchedulerConfig
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm

# argv[1] of the process that ran the code: "-c"/"-r" only for the pre-started interpreter
# (`python3 -c <bootstrap> /run/sbx/main.py`, `node -r <preload> /run/sbx/main.js`); a cold run
# is `python3 /run/sbx/main.py`. (A node started from the startup snapshot has its two options
# first: WHO_JS looks for the preload's.)
WHO_PY = "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode())\n"
WHO_JS = (
    "console.log(require('fs').readFileSync('/proc/self/cmdline', 'latin1').split('\\0')"
    ".includes('-r') ? '-r' : 'script');"
)


@pytest.fixture
def pooled(images_ready: None, tmp_path: Path) -> Callable[[], Any]:
    @asynccontextmanager
    async def factory() -> AsyncIterator[Scheduler]:
        config = SchedulerConfig(
            warm_pool_size=1,
            memory_snapshots=False,
            max_concurrent_vms=4,
            memory_snapshot_cache_dir=tmp_path / "snapshots",
        )
        async with Scheduler(config) as sched:
            yield sched
        assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"

    return factory


async def pool_hit(sched: Scheduler, code: str, **kw: Any) -> ExecutionResult:
    await sched.wait_pool_ready(timeout=300)
    result = await sched.run(code, **kw)
    assert result.warm_pool_hit, result
    return result


async def test_pool_hits_run_in_the_prestarted_interpreter_like_a_cold_run(
    pooled: Callable[[], Any],
) -> None:
    crash = "def f():\n    raise ValueError('boom')\nf()\n"
    async with pooled() as sched:
        r = await pool_hit(
            sched,
            WHO_PY + "import os, sys\n"
            "print(__name__, __file__, sys.argv, sys.path[0], os.getuid(),"
            " repr(sys.stdin.read()), os.getcwd())",
        )
        assert r.stdout == (
            "-c\n__main__ /run/sbx/main.py ['/run/sbx/main.py'] /run/sbx 1000 '' /home/user\n"
        ), r
        assert r.exit_code == 0
        r = await pool_hit(sched, WHO_PY + "import sys; sys.exit(3)")
        assert (r.stdout, r.exit_code) == ("-c\n", 3)
        # A script's globals are its own: shadowing builtins there leaves the bootstrap's alone.
        r = await pool_hit(
            sched, WHO_PY + "import sys\nprint = isinstance = None\nbytes = str\nsys.exit(7)"
        )
        assert (r.stdout, r.stderr, r.exit_code) == ("-c\n", "", 7), r
        warm_crash = await pool_hit(sched, crash)
        r = await pool_hit(
            sched, WHO_PY + "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)"
        )
        assert (r.stdout, r.exit_code) == ("-c\n", 143)
        r = await pool_hit(sched, "import time; time.sleep(60)", timeout_seconds=1)
        assert r.exit_code == -1 and "timed out" in r.stderr
        with pytest.raises(OutputLimitError):
            await pool_hit(sched, "import sys\nfor _ in range(40): sys.stdout.write('x' * 32768)")
        # Variables are not in the pre-started environment: such a request gets a fresh process.
        r = await pool_hit(
            sched, WHO_PY + "import os; print(os.environ['GREETING'])", env_vars={"GREETING": "hi"}
        )
        assert (r.stdout, r.exit_code) == ("/run/sbx/main.py\nhi\n", 0)
        r = await pool_hit(
            sched,
            WHO_JS + "console.log(typeof require('fs').statSync,"
            " require.main === module, process.argv[1]); process.exit(4)",
            language="javascript",
        )
        assert (r.stdout, r.stderr, r.exit_code) == (
            "-r\nfunction true /run/sbx/main.js\n",
            "",
            4,
        ), r
        r = await pool_hit(
            sched,
            "head -c 8 /proc/$$/cmdline | tr '\\0' ' '; echo; echo \"$0\";"
            " echo ${BASH_EXECUTION_STRING-unset}; set | grep -c ^_sbx; exit 5",
            language="raw",
        )
        assert (r.stdout, r.exit_code) == ("bash -c \n/run/sbx/main.sh\nunset\n0\n", 5), r
        js_crash = "function f() { throw new Error('boom'); }\nf();\n"
        warm_js_crash = await pool_hit(sched, js_crash, language="javascript")
        # The same crashes in cold VMs (another memory size is never served by the pool).
        cold_crash = await sched.run(crash, memory_mb=256)
        assert not cold_crash.warm_pool_hit
        cold_js_crash = await sched.run(js_crash, language="javascript", memory_mb=256)
    # Node: the same trace down to node's entry point (the frames below it differ: [eval]).
    entry = "executeUserEntryPoint"
    warm_js, cold_js = warm_js_crash.stderr, cold_js_crash.stderr
    assert entry in warm_js and entry in cold_js, (warm_js, cold_js)
    assert warm_js[: warm_js.index(entry)] == cold_js[: cold_js.index(entry)]
    assert warm_js_crash.exit_code == cold_js_crash.exit_code == 1
    assert (warm_crash.stdout, warm_crash.stderr, warm_crash.exit_code) == (
        cold_crash.stdout,
        cold_crash.stderr,
        cold_crash.exit_code,
    )
    assert warm_crash.exit_code == 1 and "ValueError: boom" in warm_crash.stderr
