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


# The terminal in the VM takes no input (a guest that never answers a write, or a program that
# never reads): stdin is an endless source, as `yes | sbx shell` or a large paste.
STALLED = CHILD.replace(
    "async def write(self, data): pass",
    "async def write(self, data): await asyncio.get_running_loop().create_future()",
)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_keystrokes_the_guest_does_not_take_stop_being_read(tmp_path: Path) -> None:
    result = tmp_path / "status"
    source = subprocess.Popen(["yes", "x" * 4000], stdout=subprocess.PIPE)
    assert source.stdout is not None
    with source, source.stdout:
        child = subprocess.Popen(
            [sys.executable, "-c", STALLED, str(result)],
            stdin=source.stdout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Without the bound this child reads /dev/zero into memory at hundreds of MB/s:
            # cap it so a regression fails this test, not the machine.
            preexec_fn=lambda: __import__("resource").setrlimit(
                __import__("resource").RLIMIT_AS, (1 << 30, 1 << 30)
            ),
        )
        try:
            time.sleep(4)
            assert child.poll() is None, child.stderr.read() if child.stderr else b""
            rss = _rss_mb(child.pid)
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            source.kill()
    # Python itself is ~30 MB; what is queued for the guest stays a few hundred KB.
    assert rss < 100, f"{rss:.0f} MB resident: stdin read without bound"
    assert result.read_text() == str(128 + signal.SIGTERM)


# A terminal that takes input slowly, then ends once its stdin is closed.
SLOW = r"""
import asyncio, hashlib, sys
from exec_sandbox.cli import shell_cmds

got = hashlib.sha256()
count = 0

class Terminal:
    def __init__(self):
        self.closed = asyncio.Event()
    def __aiter__(self):
        return self
    async def __anext__(self):
        await self.closed.wait()
        raise StopAsyncIteration
    async def write(self, data):
        global count
        await asyncio.sleep(0.001)
        got.update(data)
        count += len(data)
    async def close_stdin(self):
        self.closed.set()
    async def resize(self, cols, rows): pass
    async def wait(self, timeout=None): return 0

class Session:
    async def terminal(self, cols, rows):
        return Terminal()

status = asyncio.run(shell_cmds._attach(Session()))
open(sys.argv[1], "w").write(f"{status} {count} {got.hexdigest()}")
"""


def test_paused_stdin_resumes_and_every_byte_reaches_the_terminal_in_order(
    tmp_path: Path,
) -> None:
    import hashlib

    data = bytes(range(256)) * 4096  # 1 MiB: far past what is queued before reading pauses
    result = tmp_path / "status"
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW, str(result)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, err = child.communicate(data, timeout=120)
    assert child.returncode == 0, err
    assert result.read_text() == f"0 {len(data)} {hashlib.sha256(data).hexdigest()}"
