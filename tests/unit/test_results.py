"""Result shaping (results.py), the one place run() and Session.exec() turn what the guest
reported into the API's answer. Outcomes are built by hand here: no VM."""

from __future__ import annotations

import pytest

from exec_sandbox import OutputLimitError
from exec_sandbox.models import TimingBreakdown
from exec_sandbox.results import OOM_NOTE, shape_result
from exec_sandbox.vm.binding import EXIT_STDERR_LIMIT, EXIT_STDOUT_LIMIT, EXIT_TIMED_OUT
from exec_sandbox.vm.execution import ExecOutcome

TIMING = TimingBreakdown(setup_ms=1, boot_ms=2, execute_ms=3, total_ms=6)


def _outcome(exit_code: int = 0, flags: int = 0) -> ExecOutcome:
    return ExecOutcome(
        stdout="partial out",
        stderr="partial err",
        exit_code=exit_code,
        flags=flags,
        duration_us=42_000,
    )


@pytest.mark.parametrize(
    ("flag", "stream"), [(EXIT_STDOUT_LIMIT, "stdout"), (EXIT_STDERR_LIMIT, "stderr")]
)
@pytest.mark.parametrize("in_session", [False, True])
def test_output_over_a_limit_raises_with_the_output_kept(
    flag: int, stream: str, in_session: bool
) -> None:
    with pytest.raises(OutputLimitError, match=f"{stream} exceeded") as raised:
        shape_result(_outcome(137, flag), timeout_seconds=5, in_session=in_session, timing=TIMING)
    assert raised.value.stdout == "partial out" and raised.value.stderr == "partial err"


def test_a_run_timeout_says_so_in_stderr() -> None:
    result = shape_result(
        _outcome(-1, EXIT_TIMED_OUT), timeout_seconds=5, in_session=False, timing=TIMING
    )
    assert result.timed_out
    assert result.stderr == "partial err\nExecution timed out after 5 seconds\n"


def test_a_session_timeout_also_says_the_repl_was_reset() -> None:
    result = shape_result(
        _outcome(-1, EXIT_TIMED_OUT), timeout_seconds=5, in_session=True, timing=TIMING
    )
    assert result.stderr.endswith(
        "timed out after 5 seconds; the REPL was reset (its state is lost)\n"
    )


def test_sigkill_gets_the_oom_note_and_a_session_says_it_is_closed() -> None:
    run = shape_result(_outcome(137), timeout_seconds=5, in_session=False, timing=TIMING)
    assert run.stderr == "partial err" + OOM_NOTE
    session = shape_result(_outcome(137), timeout_seconds=5, in_session=True, timing=TIMING)
    assert session.stderr == "partial err" + OOM_NOTE + (
        "The session is closed (the REPL and its state are gone).\n"
    )


def test_a_normal_exit_is_reported_as_the_guest_said() -> None:
    result = shape_result(
        _outcome(3),
        timeout_seconds=5,
        in_session=False,
        timing=TIMING,
        cpu_ms=7,
        peak_mb=64,
        warm_pool_hit=True,
        l1_cache_hit=True,
    )
    assert (result.stdout, result.stderr, result.exit_code) == ("partial out", "partial err", 3)
    assert result.execution_time_ms == 42 and result.timing == TIMING
    assert (result.external_cpu_time_ms, result.external_memory_peak_mb) == (7, 64)
    assert result.warm_pool_hit and result.l1_cache_hit
