"""What the API reports for one execution's end, in one place for run() and Session.exec():
output over the limits raises OutputLimitError (with the output up to the limit), a timeout or
an OOM kill gets its note appended to stderr, and the rest becomes an ExecutionResult."""

from __future__ import annotations

from collections.abc import Sequence

from . import limits
from .errors import OutputLimitError
from .models import ExecutionResult, ExposedPort, NetworkConnection, TimingBreakdown
from .vm.binding import EXIT_REPL_RESET, EXIT_STDERR_LIMIT, EXIT_STDOUT_LIMIT
from .vm.execution import ExecOutcome

# A guest process ended by SIGKILL (128 + 9), not by the timeout: in a sandbox that is almost
# always the guest kernel's OOM killer.
EXIT_SIGKILL = 137
# The exit code of an execution the guest ended at its timeout (ExecutionResult.timed_out).
EXIT_TIMEOUT = -1
OOM_NOTE = (
    "\nKilled by SIGKILL (exit 137): most likely the VM ran out of memory and its kernel's OOM "
    "killer ended the process; give it more memory (memory_mb) or make the code use less\n"
)
# What a session adds (the public contract: a timeout resets the REPL, exit 137 closes the session).
_SESSION_TIMEOUT_NOTE = "; the REPL was reset (its state is lost)"
_SESSION_OOM_NOTE = "The session is closed (the REPL and its state are gone).\n"


def shape_result(
    outcome: ExecOutcome,
    *,
    timeout_seconds: float,
    in_session: bool,
    timing: TimingBreakdown,
    cpu_ms: int | None = None,
    peak_mb: int | None = None,
    warm_pool_hit: bool = False,
    l1_cache_hit: bool = False,
    exposed_ports: Sequence[ExposedPort] = (),
    network_log: Sequence[NetworkConnection] = (),
) -> ExecutionResult:
    """The ExecutionResult of outcome (cpu_ms, peak_mb: QEMU's figures from its cgroup).
    Raises OutputLimitError, carrying the output up to the limit, when the guest cut the code
    off at a limit."""
    if outcome.flags & EXIT_STDOUT_LIMIT:
        raise OutputLimitError(
            f"stdout exceeded {limits.STDOUT_LIMIT_BYTES} bytes",
            stdout=outcome.stdout,
            stderr=outcome.stderr,
        )
    if outcome.flags & EXIT_STDERR_LIMIT:
        raise OutputLimitError(
            f"stderr exceeded {limits.STDERR_LIMIT_BYTES} bytes",
            stdout=outcome.stdout,
            stderr=outcome.stderr,
        )
    stderr = outcome.stderr
    if outcome.exit_code == EXIT_TIMEOUT:
        stderr += (
            f"\nExecution timed out after {timeout_seconds} seconds"
            f"{_SESSION_TIMEOUT_NOTE if in_session else ''}\n"
        )
    elif outcome.exit_code == EXIT_SIGKILL:
        stderr += OOM_NOTE + (_SESSION_OOM_NOTE if in_session else "")
    elif in_session and outcome.flags & EXIT_REPL_RESET:
        # The REPL died (a signal, os._exit): the session goes on in a fresh one, and whoever
        # reads the result must not take the lost variables for a bug of the next cell.
        stderr += f"\nThe REPL process ended (exit {outcome.exit_code}){_SESSION_TIMEOUT_NOTE}\n"
    return ExecutionResult(
        stdout=outcome.stdout,
        stderr=stderr,
        exit_code=outcome.exit_code,
        execution_time_ms=outcome.duration_us // 1000,
        external_cpu_time_ms=cpu_ms,
        external_memory_peak_mb=peak_mb,
        timing=timing,
        warm_pool_hit=warm_pool_hit,
        l1_cache_hit=l1_cache_hit,
        exposed_ports=list(exposed_ports),
        network_log=list(network_log),
        outputs=outcome.outputs,
        tool_calls=outcome.tool_calls,
    )
