"""The ADK executor refuses, when it is made, settings it could never serve, with an error that
says what to do instead (not a RuntimeError deep inside the agent's run)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("google.adk", reason="the [adk] extra is not installed")

from exec_sandbox import Scheduler
from exec_sandbox.integrations.adk import ExecSandboxCodeExecutor


def _stand_in() -> Scheduler:
    """A caller's Scheduler, never started: the checks run before it is used (no VM)."""
    return Scheduler()


def test_a_scheduler_given_outside_a_running_loop_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="no event loop is running") as caught:
        ExecSandboxCodeExecutor(scheduler=_stand_in())
    assert not isinstance(caught.value, RuntimeError)
    assert "scheduler=None" in str(caught.value)


def test_a_scheduler_given_inside_a_running_loop_is_accepted() -> None:
    async def make() -> ExecSandboxCodeExecutor:
        return ExecSandboxCodeExecutor(scheduler=_stand_in())

    assert asyncio.run(make()).scheduler is not None


def test_optimize_data_file_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="does not support optimize_data_file=True"):
        ExecSandboxCodeExecutor(optimize_data_file=True)
    assert ExecSandboxCodeExecutor().optimize_data_file is False
