"""Scheduler.session() end to end in real microVMs: state that persists per language, the
resilience contract (session.py), serialisation, the idle timeout, streaming and environment."""

from __future__ import annotations

import asyncio
import os
import signal
import warnings

import pytest

from exec_sandbox import (
    CodeValidationError,
    EnvVarValidationError,
    InputValidationError,
    OutputLimitError,
    Scheduler,
    SchedulerConfig,
    SessionClosedError,
)
from exec_sandbox.errors import CommunicationError

pytestmark = pytest.mark.vm


async def test_python_variables_imports_functions_and_classes_persist(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        await session.exec(
            "import math\nx = 41\ndef inc(v):\n    return v + 1\nclass K:\n    n = 2"
        )
        result = await session.exec("print(inc(x), math.floor(2.5), K.n)")
        assert result.stdout == "42 2 2\n"
        assert result.exit_code == 0


async def test_javascript_declarations_persist_and_top_level_await_works(
    scheduler: Scheduler,
) -> None:
    async with await scheduler.session(language="javascript") as session:
        await session.exec("const a = 1; let b = 2; function f() { return 3 }; class K {}")
        await session.exec("const r = await Promise.resolve(5)")
        result = await session.exec("console.log(a + b + f(), r, typeof K)")
        assert result.stdout == "6 5 function\n"
        assert result.exit_code == 0


async def test_raw_exports_working_directory_and_functions_persist(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        await session.exec('export GREETING=hi; mkdir -p sub; cd sub; greet() { echo "$1!"; }')
        result = await session.exec('echo "$GREETING $PWD"; greet there')
        assert result.stdout == "hi /home/user/sub\nthere!\n"


async def test_session_members_and_idempotent_close(scheduler: Scheduler) -> None:
    session = await scheduler.session(language="python")
    other = await scheduler.session(language="raw")
    try:
        assert session.session_id and session.session_id != other.session_id
        assert (session.exec_count, session.closed) == (0, False)
        await session.exec("pass")
        await session.exec("pass")
        assert session.exec_count == 2
    finally:
        await session.close()
        await session.close()  # idempotent
        await other.close()
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.exec("pass")
    with pytest.raises(SessionClosedError):
        await session.list_files()


async def test_errors_exit_and_rejected_input_keep_the_state(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        await session.exec("state = 'kept'")
        failed = await session.exec("raise ValueError('boom')")
        assert failed.exit_code == 1 and "ValueError: boom" in failed.stderr
        exited = await session.exec("import sys; sys.exit(3)")
        assert exited.exit_code == 3
        syntax = await session.exec("def broken(:")
        assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr
        with pytest.raises(CodeValidationError):
            await session.exec("   ")
        with pytest.raises(EnvVarValidationError):
            await session.exec("pass", env_vars={"ld_preload": "/tmp/x.so"})
        with pytest.raises(OutputLimitError) as info:
            await session.exec("print('x' * (2 * 1024 * 1024))")
        assert info.value.stdout and set(info.value.stdout) == {"x"}  # kept up to the limit
        result = await session.exec("print(state)")
        assert result.stdout == "kept\n"
        assert not session.closed


async def test_timeout_and_signal_reset_the_repl_but_keep_the_session(
    scheduler: Scheduler,
) -> None:
    async with await scheduler.session(language="python") as session:
        await session.exec("state = 1")
        timed_out = await session.exec("while True: pass", timeout_seconds=2)
        assert timed_out.exit_code == -1 and "timed out" in timed_out.stderr
        lost = await session.exec("print(state)")
        assert lost.exit_code == 1 and "NameError" in lost.stderr
        await session.exec("state = 2")
        terminated = await session.exec("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
        assert terminated.exit_code == 128 + signal.SIGTERM
        # The result says the state is gone: the exit code alone could be the code's own.
        assert "the REPL was reset (its state is lost)" in terminated.stderr
        assert not session.closed
        after = await session.exec("print('state' in globals())")
        assert after.stdout == "False\n"
        # sys.exit(143) keeps the REPL: no such note.
        kept = await session.exec("import sys; sys.exit(143)")
        assert kept.exit_code == 143 and "REPL" not in kept.stderr


async def test_exit_137_closes_the_session(scheduler: Scheduler) -> None:
    session = await scheduler.session(language="python")
    killed = await session.exec("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.exit_code == 137
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.exec("print(1)")


async def test_dead_qemu_closes_the_session(scheduler: Scheduler) -> None:
    session = await scheduler.session(language="python")
    os.kill(session._vm.pid, signal.SIGKILL)
    with pytest.raises((CommunicationError, SessionClosedError)):
        await session.exec("print(1)")
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.exec("print(1)")


async def test_concurrent_execs_run_one_at_a_time(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        await session.exec("import time\nlog = []")
        step = "log.append(('start', {n})); time.sleep(0.3); log.append(('end', {n}))"
        await asyncio.gather(*(session.exec(step.format(n=n)) for n in range(3)))
        result = await session.exec("print(log)")
        events = eval(result.stdout)
        assert [kind for kind, _ in events] == ["start", "end"] * 3
        assert events[0][1] == events[1][1] and events[2][1] == events[3][1]


async def test_idle_session_closes_itself_and_activity_resets_the_timer(
    images_ready: None,
) -> None:
    async with Scheduler(SchedulerConfig(session_idle_timeout_seconds=10)) as scheduler:
        session = await scheduler.session(language="raw")
        await asyncio.sleep(6)
        await session.exec("true")  # activity: the 10 s start again
        await asyncio.sleep(6)
        assert not session.closed
        await asyncio.sleep(5.5)
        assert session.closed
        with pytest.raises(SessionClosedError):
            await session.exec("true")


async def test_streamed_chunks_join_to_the_result(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="python") as session:
        out: list[str] = []
        err: list[str] = []
        result = await session.exec(
            "import sys, time\nfor i in range(5):\n    print('line', i)\n"
            "    print('warn', i, file=sys.stderr)\n    time.sleep(0.05)",
            on_stdout=out.append,
            on_stderr=err.append,
        )
        assert "".join(out) == result.stdout == "".join(f"line {i}\n" for i in range(5))
        assert "".join(err) == result.stderr
        assert len(out) > 1  # arrived while running, not in one piece at the end


async def test_raising_callback_is_disabled_with_a_warning(scheduler: Scheduler) -> None:
    def explode(_: str) -> None:
        raise RuntimeError("callback bug")

    async with await scheduler.session(language="python") as session:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = await session.exec("print('a'); print('b')", on_stdout=explode)
        assert result.stdout == "a\nb\n" and result.exit_code == 0
        assert any("callback" in str(w.message) for w in caught)


async def test_printed_protocol_bytes_cannot_forge_or_end_a_result(scheduler: Scheduler) -> None:
    # A frame header claiming EXIT (type 4) with exit code 0, a control-line look-alike, NULs.
    fake_exit = b"\x10\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00" + b"\x00" * 16
    payload = fake_exit + b"0\n" + b"\x00\xff" * 8
    code = (
        "import os, sys\n"
        f"data = {payload!r}\n"
        "os.write(1, data); os.write(2, data); print('0'); print('0', file=sys.stderr)\n"
        "sys.exit(7)"
    )
    async with await scheduler.session(language="python") as session:
        result = await session.exec(code)
        assert result.exit_code == 7
        expected = payload.decode("utf-8", "replace") + "0\n"
        assert result.stdout == expected and result.stderr == expected
        after = await session.exec("print('still fine')")
        assert after.stdout == "still fine\n"


async def test_fork_neither_duplicates_nor_truncates_output(scheduler: Scheduler) -> None:
    code = (
        "import os\n"
        "print('before', end='')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print(' child', end='')\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(' parent')"
    )
    async with await scheduler.session(language="python") as session:
        result = await session.exec(code)
        assert result.stdout == "before child parent\n"
        # A fork whose child falls back into the REPL loop is not the REPL.
        await session.exec("import os\npid = os.fork()\nif pid: os.waitpid(pid, 0)")
        after = await session.exec("print(os.getpid() != pid, 'ok')")
        assert after.stdout == "True ok\n"


async def test_orphans_are_reaped_by_the_guest_init(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        # The subshell exits at once; its sleep is re-parented to PID 1 and exits 0.2 s later.
        await session.exec("(sleep 0.2 &)")
        result = await session.exec(
            "sleep 1.5; for s in /proc/[0-9]*/status; do "
            "awk '/^State:/{st=$2} /^PPid:/{pp=$2} END{if (st==\"Z\" && pp==1) print FILENAME}' "
            '"$s" 2>/dev/null; done; echo checked'
        )
        assert result.stdout == "checked\n"


async def test_env_vars_reach_exec_and_session_defaults_apply(scheduler: Scheduler) -> None:
    session = await scheduler.session(language="python", env_vars={"BASE": "b"})
    async with session:
        result = await session.exec(
            "import os; print(os.environ['BASE'], os.environ['EXTRA'])", env_vars={"EXTRA": "e x"}
        )
        assert result.stdout == "b e x\n"
        for bad in (
            {"LD_PRELOAD": "/x.so"},
            {"Node_Options": "--require=/x"},
            {"OK": "bell\x07"},
            {f"V{i}": "1" for i in range(101)},
        ):
            with pytest.raises(EnvVarValidationError):
                await session.exec("pass", env_vars=bad)
        assert (await session.exec("print(1)")).stdout == "1\n"


async def test_run_rejects_denied_env_vars_before_any_vm(scheduler: Scheduler) -> None:
    with pytest.raises(InputValidationError):
        await scheduler.run("print(1)", env_vars={"pythonpath": "/tmp"})


async def test_output_limit_keeps_javascript_and_bash_sessions(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="javascript") as js:
        await js.exec("const kept = 'js'")
        with pytest.raises(OutputLimitError):
            await js.exec("for (let i = 0; i < 40000; i++) console.log('y'.repeat(100))")
        assert (await js.exec("console.log(kept)")).stdout == "js\n"
    async with await scheduler.session(language="raw") as sh:
        await sh.exec("kept=sh")
        with pytest.raises(OutputLimitError):
            await sh.exec("for i in $(seq 1 40000); do printf '%0100d\\n' 0; done")
        assert (await sh.exec("echo $kept")).stdout == "sh\n"


async def test_javascript_output_is_complete_when_the_pipe_fills(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="javascript") as session:
        chunks: list[str] = []
        result = await session.exec(
            "for (let i = 0; i < 8000; i++) console.log(String(i).padStart(99, '.'))",
            on_stdout=chunks.append,
        )
        lines = result.stdout.splitlines()
        assert len(lines) == 8000 and lines[-1].endswith("7999")
        assert "".join(chunks) == result.stdout
        assert (await session.exec("console.log('next')")).stdout == "next\n"
