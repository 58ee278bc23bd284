"""Terminals (session.terminal) in real VMs: a python3 REPL driven by keystrokes, the size after a
resize, Ctrl-C, a /dev/pts path, and `sbx shell` driven through tmux as a person would use it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, Terminal
from exec_sandbox.paths import images_dir

pytestmark = pytest.mark.vm


async def expect(terminal: Terminal, needle: bytes, timeout: float = 60.0) -> bytes:
    """The terminal's output from where the last expect() stopped until `needle` appeared.
    Polls with short read timeouts on purpose: a read that times out must lose nothing."""
    seen = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while needle not in seen:
        assert loop.time() < deadline, f"no {needle!r} within {timeout} s: {seen!r}"
        try:
            chunk = await terminal.read(timeout=0.2)
        except TimeoutError:
            continue
        if not chunk:
            raise AssertionError(f"terminal ended before {needle!r}: {seen!r}")
        seen += chunk
    return seen


async def expect_then(terminal: Terminal, first: bytes, then: bytes, timeout: float = 60.0) -> None:
    """`first`, then `then` after it (a prompt redrawn before the answer does not count)."""
    seen = await expect(terminal, first, timeout)
    if then not in seen.split(first, 1)[1]:
        await expect(terminal, then, timeout)


async def test_a_python_repl_driven_by_keystrokes_with_ctrl_c(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        async with await session.terminal(80, 24) as term:
            assert term.pty and term.pid > 1
            await expect(term, b"$ ")
            await term.write("python3 -q\r")
            await expect(term, b">>> ")
            # Python's REPL (3.13's redraws its line, prompt included, as keys come) answers.
            await term.write("import sys; print(sys.stdin.isatty(), 6 * 7)\r")
            await expect_then(term, b"True 42", b">>> ")
            # Ctrl-C interrupts the running statement; the REPL goes on.
            await term.write("import time; time.sleep(60)\r")
            await asyncio.sleep(1.0)
            await term.write(b"\x03")
            await expect_then(term, b"KeyboardInterrupt", b">>> ", timeout=30)
            await term.write("exit()\r")
            await expect(term, b"$ ")
            await term.write("exit 3\r")
            assert await term.wait(timeout=30) == 3
        assert term.exit_code == 3


async def test_stty_size_follows_a_resize_and_tty_names_a_pty(scheduler: Scheduler) -> None:
    async with await scheduler.session(language="raw") as session:
        term = await session.terminal(100, 30)
        try:
            await expect(term, b"$ ")
            await term.write("stty size; tty; echo $TERM\r")
            shown = await expect(term, b"xterm-256color\r\n")
            assert b"30 100\r\n" in shown and b"/dev/pts/" in shown
            await term.resize(132, 43)
            assert (term.cols, term.rows) == (132, 43)
            await term.write("stty size\r")
            assert b"43 132\r\n" in await expect(term, b"43 132\r\n")
        finally:
            assert await term.close() is not None
        # A command of one's own instead of the shell, its output on stdout only.
        short = await session.terminal(40, 10, cmd=["sh", "-c", "stty size; tty"])
        assert await short.wait(timeout=30) == 0
        out = await short.stdout.read()
        assert out.startswith(b"10 40\r\n/dev/pts/") and await short.stderr.read() == b""


def _private_env(tmp_path: Path) -> dict[str, str]:
    """The CLI's environment with a cache of its own: `sbx shell` then never waits on a
    snapshot build another test process holds in the user's cache, and leaves nothing there."""
    return {
        **os.environ,
        "EXEC_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
    }


def test_sbx_shell_through_tmux(tmp_path: Path, images_ready: None) -> None:
    tmux = shutil.which("tmux")
    assert tmux, "tmux is a test dependency (scripts/install-system-deps.sh)"
    sbx = Path(sys.executable).with_name("sbx")
    name = f"sbx-shell-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    # Its own tmux server (-L): the test never touches the user's sessions.
    base = [tmux, "-L", name]
    subprocess.run(
        [*base, "new-session", "-d", "-s", name, "-x", "100", "-y", "30",
         f"{sbx} shell; echo $? > {status}; sleep 30"],
        check=True,
        env={**_private_env(tmp_path), "TMUX": ""},
    )  # fmt: skip

    def screen() -> str:
        return subprocess.run(
            [*base, "capture-pane", "-p", "-t", name], capture_output=True, text=True
        ).stdout

    def keys(*k: str) -> None:
        subprocess.run([*base, "send-keys", "-t", name, *k], check=True)

    def wait_for(text: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = screen()
            if text in shown:
                return shown
            time.sleep(0.3)
        raise AssertionError(f"{text!r} never shown; screen:\n{screen()}")

    try:
        wait_for("user@")
        keys("stty size; tty", "Enter")
        shown = wait_for("/dev/pts/")
        assert "30 100" in shown
        subprocess.run([*base, "resize-window", "-t", name, "-x", "120", "-y", "40"], check=True)
        time.sleep(1.0)
        keys("clear; stty size", "Enter")
        wait_for("40 120")
        keys("sleep 100", "Enter")
        time.sleep(1.0)
        keys("C-c")
        keys("echo after-$((40+2))", "Enter")
        wait_for("after-42")
        keys("exit 5", "Enter")
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert status.read_text().strip() == "5"
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)


def test_sbx_shell_pause_then_resume_keeps_the_session(tmp_path: Path, images_ready: None) -> None:
    """Without a terminal on stdin (a pipe): the keys are typed as they come, end of input is
    Ctrl-D; --pause prints the id that --resume opens. With --network: its relay is set up
    again on resume."""
    sbx = str(Path(sys.executable).with_name("sbx"))
    first = subprocess.run(
        [sbx, "shell", "--pause", "--network"],
        input=b"echo kept > note.txt\nexit 0\n",
        capture_output=True,
        env=_private_env(tmp_path),
        timeout=240,
    )
    assert first.returncode == 0, first.stderr
    snapshot = first.stderr.decode().strip().rsplit(" ", 1)[-1]
    try:
        again = subprocess.run(
            [sbx, "shell", "--resume", snapshot],
            input=b"cat note.txt; exit 4\n",
            capture_output=True,
            env=_private_env(tmp_path),
            timeout=240,
        )
        assert again.returncode == 4, again.stderr
        assert b"kept" in again.stdout
    finally:
        subprocess.run(
            [sbx, "session", "delete", snapshot], capture_output=True, env=_private_env(tmp_path)
        )


def test_sbx_shell_with_a_disk_size_and_a_volume(tmp_path: Path, images_ready: None) -> None:
    """--disk-mb and --volume as `sbx run` takes them; with --pause, a read-write volume
    (which a paused session cannot keep) is refused before any VM starts."""
    sbx = str(Path(sys.executable).with_name("sbx"))
    env = {**_private_env(tmp_path), "EXEC_SANDBOX_DATA_DIR": str(tmp_path / "data")}

    def shell(*args: str, keys: bytes = b"exit 0\n") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sbx, "shell", *args], input=keys, capture_output=True, env=env, timeout=240
        )

    made = subprocess.run([sbx, "volume", "create", "proj", "--size-mb", "32"], env=env)
    assert made.returncode == 0
    result = shell("--pause", "--volume", "/mnt/p=proj")
    assert result.returncode == 2, result.stderr
    assert b"--pause" in result.stderr
    used = shell(
        "--disk-mb",
        "128",
        "--volume",
        "/mnt/p=proj",
        keys=b"echo kept > /mnt/p/f; df -m /home/user | tail -1; exit 3\n",
    )
    assert used.returncode == 3, used.stderr
    size_mb = int(used.stdout.decode().split("/dev/")[-1].split()[1])
    assert 100 <= size_mb <= 128  # the file system of a 128 MB disk, not the default 4096
    read = subprocess.run(
        [sbx, "run", "-l", "raw", "--volume", "/mnt/p=proj:ro", "-c", "cat /mnt/p/f"],
        capture_output=True,
        env=env,
        timeout=240,
    )
    assert read.stdout == b"kept\n", read.stderr
