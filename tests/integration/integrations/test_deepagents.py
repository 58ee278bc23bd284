"""Deep Agents: create_deep_agent with ExecSandboxBackend and a scripted model; its file and
shell tools act in a real VM and the results reach the model's next turn. Plus the backend's
own contract points the standard suite does not pin down (timeout 124 and the clamp to our
limit, truncation, batched transfers, a keyed backend paused when dropped), and both glob/write
contracts: deepagents' BaseSandbox (the default) and langchain-tests' ("standard")."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepagents", reason="the deepagents extra is not installed")

from deepagents import create_deep_agent
from deepagents.backends.protocol import GlobResult
from langchain_core.messages import AIMessage, ToolMessage

from exec_sandbox.integrations._bridge import background
from exec_sandbox.integrations.deepagents import ExecSandboxBackend
from exec_sandbox.limits import MAX_TIMEOUT_SECONDS

from .conftest import GUEST_PROOF_OUTPUT
from .fake_langchain_model import ScriptedChatModel

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[3]


def _call(name: str, args: dict[str, object], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def _last_tool_message(model: ScriptedChatModel, turn: int) -> ToolMessage:
    return [m for m in model.seen[turn] if isinstance(m, ToolMessage)][-1]


async def test_deep_agent_writes_globs_and_executes_in_the_vm() -> None:
    backend = ExecSandboxBackend()
    model = ScriptedChatModel(
        responses=[
            _call(
                "write_file",
                {"file_path": "/tmp/work/calc.py", "content": "print('first draft')\n"},
                "c1",
            ),
            _call(
                "write_file",
                {
                    "file_path": "/tmp/work/calc.py",
                    "content": "import os\nprint(os.uname().nodename, os.getuid(), 6 * 7)\n",
                },
                "c2",
            ),
            _call("glob", {"pattern": "*.py", "path": "/tmp/work"}, "c3"),
            _call("execute", {"command": "python3 /tmp/work/calc.py"}, "c4"),
            _call("execute", {"command": "sleep 30", "timeout": 2}, "c5"),
            _call("execute", {"command": "echo partial; exit 5"}, "c6"),
            AIMessage(content="done"),
        ]
    )
    agent = create_deep_agent(model=model, backend=backend)
    try:
        await agent.ainvoke({"messages": [("user", "compute")]})
    finally:
        await backend.aclose()
    assert "Updated file /tmp/work/calc.py" in str(_last_tool_message(model, 1).content)
    # BaseSandbox's write: the second write_file overwrites.
    assert "Updated file /tmp/work/calc.py" in str(_last_tool_message(model, 2).content)
    # BaseSandbox's glob: absolute paths of files.
    assert str(_last_tool_message(model, 3).content) == "['/tmp/work/calc.py']"
    ran = str(_last_tool_message(model, 4).content)
    assert GUEST_PROOF_OUTPUT in ran and "first draft" not in ran
    assert "124" in str(_last_tool_message(model, 5).content)
    last = str(_last_tool_message(model, 6).content)
    assert "partial" in last and "5" in last


def _paths(result: GlobResult) -> list[tuple[str, bool]]:
    assert result.error is None, result.error
    assert result.matches is not None
    return [(m["path"], m.get("is_dir", False)) for m in result.matches]


def test_standard_contract_glob_is_relative_with_directories_and_write_never_overwrites() -> None:
    backend = ExecSandboxBackend(file_contract="standard")
    try:
        for path in ("/tmp/g/a.py", "/tmp/g/sub/b.py", "/tmp/g/.hidden.py", "/tmp/g/.dot/c.py"):
            assert backend.write(path, "x = 1\n").error is None
        assert backend.execute("mkdir /tmp/g/empty && touch /tmp/g/notes.txt").exit_code == 0
        # A pattern without / matches at any depth (never inside dot-directories); directories
        # are matches too, flagged is_dir.
        assert _paths(backend.glob("*", path="/tmp/g")) == [
            ("a.py", False),
            ("empty", True),
            ("notes.txt", False),
            ("sub", True),
            ("sub/b.py", False),
        ]
        assert _paths(backend.glob("/*.py", path="/tmp/g")) == [("a.py", False)]
        assert _paths(backend.glob("sub/*.py", path="/tmp/g")) == [("sub/b.py", False)]
        assert _paths(backend.glob(".*", path="/tmp/g")) == [(".dot", True), (".hidden.py", False)]
        assert _paths(backend.glob("*.{txt,md}", path="/tmp/g")) == [("notes.txt", False)]
        assert _paths(backend.glob("*.rs", path="/tmp/g")) == []
        missing = backend.glob("*", path="/tmp/nowhere")
        assert missing.error is not None and "not a directory" in missing.error
        # write refuses an existing file and leaves it as it was; a new one is created.
        refused = backend.write("/tmp/g/a.py", "x = 2\n")
        assert refused.error is not None and "already exists" in refused.error
        assert refused.path is None
        assert backend.execute("cat /tmp/g/a.py").output == "x = 1\n"
        assert backend.write("/tmp/g/dir/new.py", "y\n").path == "/tmp/g/dir/new.py"
        assert backend.write("relative.py", "z").error is not None
    finally:
        backend.close()


async def test_default_contract_is_base_sandbox_glob_and_write() -> None:
    backend = ExecSandboxBackend()
    try:
        assert (await backend.awrite("/tmp/d/a.py", "x = 1\n")).error is None
        assert (await backend.awrite("/tmp/d/a.py", "x = 2\n")).error is None
        assert (await backend.aexecute("cat /tmp/d/a.py")).output == "x = 2\n"
        assert (await backend.awrite("/tmp/d/sub/b.py", "y\n")).error is None
        # Absolute paths, files only (the directory sub is never a match).
        both = [("/tmp/d/a.py", False), ("/tmp/d/sub/b.py", False)]
        assert _paths(await backend.aglob("**/*.py", path="/tmp/d")) == both
        assert _paths(await backend.aglob("*", path="/tmp/d")) == both
        assert _paths(backend.glob("sub/*.py", path="/tmp/d")) == [("/tmp/d/sub/b.py", False)]
    finally:
        await backend.aclose()
    with pytest.raises(ValueError, match="file_contract"):
        ExecSandboxBackend(file_contract="posix")  # type: ignore[arg-type]


async def test_concurrent_first_calls_share_one_vm() -> None:
    # deepagents runs tool calls in parallel: the first calls of a backend race to open its VM.
    backend = ExecSandboxBackend()
    try:
        results = await asyncio.gather(
            *(backend.aexecute("cat /proc/sys/kernel/random/boot_id") for _ in range(3))
        )
        assert all(r.exit_code == 0 for r in results), results
        assert len({r.output for r in results}) == 1, results  # one guest kernel answered
        live = [s for s in background().scheduler._sessions if not s.closed]
        assert len(live) == 1, live
    finally:
        await backend.aclose()


def test_timeout_exit_124_and_truncation() -> None:
    backend = ExecSandboxBackend(max_output_bytes=1000)
    try:
        timed_out = backend.execute("echo started; sleep 30", timeout=2)
        assert timed_out.exit_code == 124
        assert "started" in timed_out.output and "timed out" in timed_out.output
        big = backend.execute("head -c 5000 /dev/zero | tr '\\0' x")
        assert big.truncated is True and big.exit_code == 0
        assert big.output == "x" * 1000
        small = backend.execute("echo ok >&2; echo fine")
        assert small.truncated is False and "ok" in small.output and "fine" in small.output
        empty = backend.execute("   ")
        assert empty.exit_code != 0 and "empty" in empty.output
    finally:
        backend.close()


def test_files_never_raise_and_keep_input_order() -> None:
    backend = ExecSandboxBackend()
    try:
        uploads = backend.upload_files(
            [
                ("/tmp/a/b/c.bin", bytes(range(256))),
                ("relative.txt", b"x"),
                ("/proc/nope/x", b"y"),
            ]
        )
        assert [u.path for u in uploads] == ["/tmp/a/b/c.bin", "relative.txt", "/proc/nope/x"]
        assert uploads[0].error is None
        assert uploads[1].error == "invalid_path"
        assert uploads[2].error is not None
        downloads = backend.download_files(["/tmp/missing", "/tmp/a/b/c.bin", "/tmp/a"])
        assert [(d.path, d.error) for d in downloads] == [
            ("/tmp/missing", "file_not_found"),
            ("/tmp/a/b/c.bin", None),
            ("/tmp/a", "is_directory"),
        ]
        assert downloads[1].content == bytes(range(256))
        assert backend.id.startswith("exec-sandbox-")
    finally:
        backend.close()


def test_packages_are_importable_by_the_agents_python() -> None:
    """The backend's shell session gets python packages: the python3 its commands run sees them
    (from the package index the host's pip uses)."""
    backend = ExecSandboxBackend(packages=["six==1.16.0"])
    try:
        result = backend.execute("python3 -c 'import six; print(six.__version__)'")
        assert (result.output.strip(), result.exit_code) == ("1.16.0", 0)
    finally:
        backend.close()


def test_a_keyed_backend_resumes_its_sandbox_after_close() -> None:
    key = f"thread-{uuid.uuid4().hex}"
    first = ExecSandboxBackend(session_key=key)
    assert (
        first.execute(
            "mkdir -p /tmp/w && cd /tmp/w && echo kept > f.txt && export MARK=yes"
        ).exit_code
        == 0
    )
    first.close()
    second = ExecSandboxBackend(session_key=key)
    try:
        result = second.execute("pwd; cat f.txt; echo $MARK")
        assert result.output.split() == ["/tmp/w", "kept", "yes"]
    finally:
        saved = second._saved
        second._saved = None  # end it for good
        second.close()
        assert saved is not None
        second._runner.run(lambda s: _forget(saved, s, key))


async def _forget(saved: Any, scheduler: Any, key: str) -> None:
    await saved.forget(scheduler, key)


def test_timeouts_pass_through_and_only_past_a_day_are_cut() -> None:
    # deepagents lets the model ask for up to an hour (0: none): both pass through unchanged;
    # only past our limit (MAX_TIMEOUT_SECONDS, a day) is the run cut, and the output says so.
    backend = ExecSandboxBackend()
    try:
        hour = backend.execute("echo ran", timeout=3600)
        assert hour.exit_code == 0 and hour.output == "ran\n"
        unlimited = backend.execute("sleep 1; echo ran", timeout=0)
        assert unlimited.exit_code == 0 and unlimited.output == "ran\n"
        over = backend.execute("echo ran", timeout=MAX_TIMEOUT_SECONDS + 1)
        assert over.exit_code == 0 and over.output.startswith("ran\n")
        assert f"timeout {MAX_TIMEOUT_SECONDS + 1} s is above this sandbox's limit" in over.output
    finally:
        backend.close()
    with pytest.raises(ValueError, match="timeout_seconds"):
        ExecSandboxBackend(timeout_seconds=MAX_TIMEOUT_SECONDS + 1)
    ExecSandboxBackend(timeout_seconds=0).close()


class _Counted:
    """Counts a session's guest round trips (exec, file transfers)."""

    def __init__(self, session: Any) -> None:
        self.calls: list[str] = []
        for name in ("exec", "write_file", "read_file"):
            setattr(session, name, self._wrap(name, getattr(session, name)))

    def _wrap(self, name: str, method: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return counted


def test_transfers_are_batched_not_per_file() -> None:
    backend = ExecSandboxBackend()
    try:
        assert backend.execute("true").exit_code == 0  # the VM is open
        counted = _Counted(backend._holder[0])
        files = [(f"/tmp/batch/d{i}/f{i}.bin", bytes([i]) * (i * 1000)) for i in range(8)]
        uploads = backend.upload_files([*files, ("/proc/nope/x", b"y"), ("rel", b"z")])
        assert [u.error for u in uploads[:8]] == [None] * 8
        assert uploads[8].error is not None and uploads[9].error == "invalid_path"
        # One file transfer and one command for all ten, where it was two per file.
        assert counted.calls == ["write_file", "exec"]
        counted.calls.clear()
        paths = [p for p, _ in files]
        downloads = backend.download_files([*paths, "/tmp/batch", "/tmp/none", "rel"])
        assert [(d.path, d.content) for d in downloads[:8]] == files
        errors = [d.error for d in downloads[8:]]
        assert errors == ["is_directory", "file_not_found", "invalid_path"]
        # One command, one file transfer, one cleanup, where it was three per file.
        assert counted.calls == ["exec", "read_file", "exec"]
    finally:
        backend.close()


def test_a_keyed_backend_dropped_without_close_is_paused_not_destroyed() -> None:
    key = f"thread-{uuid.uuid4().hex}"
    first = ExecSandboxBackend(session_key=key)
    assert first.execute("echo kept > /tmp/dropped.txt && export MARK=yes").exit_code == 0
    del first
    gc.collect()
    second = ExecSandboxBackend(session_key=key)
    try:
        result = second.execute("cat /tmp/dropped.txt; echo $MARK")
        assert result.output.split() == ["kept", "yes"]
    finally:
        saved = second._saved
        second._saved = None  # end it for good
        second.close()
        assert saved is not None
        second._runner.run(lambda s: _forget(saved, s, key))


def test_a_keyed_backend_left_open_at_exit_is_paused_for_the_next_process() -> None:
    key = f"thread-{uuid.uuid4().hex}"
    script = textwrap.dedent(f"""
        from exec_sandbox.integrations.deepagents import ExecSandboxBackend
        backend = ExecSandboxBackend(session_key={key!r})
        assert backend.execute("echo kept > /tmp/exit.txt").exit_code == 0
        KEEP = backend  # never closed, alive at exit
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    second = ExecSandboxBackend(session_key=key)
    try:
        assert second.execute("cat /tmp/exit.txt").output == "kept\n"
    finally:
        saved = second._saved
        second._saved = None  # end it for good
        second.close()
        assert saved is not None
        second._runner.run(lambda s: _forget(saved, s, key))
