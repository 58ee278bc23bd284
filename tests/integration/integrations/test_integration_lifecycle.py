"""Lifecycle of the shared background scheduler: abandoned integration objects and interpreter
exit leave no VM behind. Uses the LangChain session tool (any integration shares the bridge)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("langchain_core", reason="the langchain extra is not installed")

from exec_sandbox.integrations._bridge import background
from exec_sandbox.integrations.langchain import ExecSandboxSessionTool
from tests.helpers import qemu_processes

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_abandoned_session_tool_frees_its_vm() -> None:
    tool = ExecSandboxSessionTool()
    tool.invoke(
        {"type": "tool_call", "id": "1", "name": tool.name, "args": {"code": "x = 1"}},
        {"configurable": {"thread_id": "t"}},
    )
    assert len(qemu_processes(parent=os.getpid())) >= 1  # + maybe a background snapshot build
    del tool
    gc.collect()
    # the autouse no_vm_leak fixture then proves the VM is gone


def test_exit_without_close_kills_the_vms() -> None:
    script = textwrap.dedent("""
        import os
        from exec_sandbox.integrations.langchain import ExecSandboxSessionTool
        from tests.helpers import qemu_processes
        tool = ExecSandboxSessionTool()
        tool.invoke({"type": "tool_call", "id": "1", "name": tool.name,
                     "args": {"code": "x = 1"}}, {"configurable": {"thread_id": "t"}})
        print(*qemu_processes(parent=os.getpid()), flush=True)
        KEEP = tool  # never closed: the atexit hook of the background scheduler must do it
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    # The session's VM, and possibly the VM building an L1 snapshot in the background.
    assert 1 <= len(pids) <= 2, pids
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "a VM outlived the interpreter that owned it"


def test_background_loop_is_shared_and_reopens_after_close() -> None:
    first = background()
    assert background() is first
    first.close()
    second = background()
    assert second is not first and second.loop.is_running()
