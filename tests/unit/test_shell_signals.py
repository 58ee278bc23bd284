"""`sbx shell`'s hold on the user's terminal (cli/shell_cmds.py, _attach): whatever ends it, the
terminal leaves raw mode. Without a VM: the session is a stand-in whose terminal never prints,
so this says nothing about the guest side (functional/test_terminal.py does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

# Runs in a child whose stdin/stdout are a pty's slave: _attach with a stand-in session.
CHILD = r"""
import asyncio, sys
from exec_sandbox.cli import shell_cmds

class Terminal:
    def __aiter__(self):
        return self
    async def __anext__(self):
        await asyncio.get_running_loop().create_future()  # never prints
    async def write(self, data): pass
    async def close_stdin(self): pass
    async def resize(self, cols, rows): pass
    async def wait(self, timeout=None): return 0

class Session:
    async def terminal(self, cols, rows):
        return Terminal()

status = asyncio.run(shell_cmds._attach(Session()))
open(sys.argv[1], "w").write(str(status))
"""


def _raw(fd: int) -> bool:
    return not termios.tcgetattr(fd)[3] & (termios.ICANON | termios.ECHO)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_restores_the_terminal_and_ends_with_its_status(
    tmp_path: Path, sig: signal.Signals
) -> None:
    master, slave = os.openpty()
    result = tmp_path / "status"
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(result)],
            stdin=slave,
            stdout=slave,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while not _raw(slave):
                assert child.poll() is None, child.stderr.read() if child.stderr else b""
                assert time.monotonic() < deadline, "the shell never put the terminal in raw mode"
                time.sleep(0.05)
            child.send_signal(sig)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        # Cooked again (a killed process would have left it raw: no echo, no line editing) and
        # an orderly end: _attach returned 128 + the signal, so the session could be closed.
        assert not _raw(slave)
        assert result.read_text() == str(128 + sig)
    finally:
        os.close(master)
        os.close(slave)
