"""Running the host's build tools (pip, npm, mkfs.erofs, a python for bytecode) without blocking
the event loop: each is a child process awaited through asyncio, killed with its process group
when the caller is cancelled or its time runs out."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import PackageBuildError, PackageNotAllowedError, VmPermanentError

# Keep what a failing tool said, but not without bound.
_OUTPUT_KEEP_CHARS = 4000


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"()<>]+")


def redact_urls(text: str) -> str:
    """text with every URL replaced by `<index>`: what goes back into a VM names no index."""
    return _URL.sub("<index>", text)


class ToolRefused(PackageNotAllowedError):
    """pip or npm would not install the requirements (not on the index, no wheel, a conflict);
    `lines` are the tool's own error lines with every URL replaced by `<index>` (they go back to
    the VM)."""

    def __init__(self, message: str, lines: list[str]) -> None:
        super().__init__(message)
        self.lines = lines


@dataclass(frozen=True)
class ToolResult:
    returncode: int
    stdout: str
    stderr: str

    def tail(self) -> str:
        text = self.stderr.strip() or self.stdout.strip()
        # Lines that point into the build directory, which is gone when the error is read.
        text = "\n".join(
            line for line in text.splitlines() if "complete log of this run" not in line
        )
        text = text[-_OUTPUT_KEEP_CHARS:]
        return text or f"(no output, exit status {self.returncode})"


def require_tool(name: str, apt_package: str) -> str:
    """The path of a host tool, or VmPermanentError saying how to install it."""
    path = shutil.which(name)
    if path is None:
        raise VmPermanentError(
            f"{name} is needed on the host to build package layers and was not found on PATH: "
            f"install it (apt-get install {apt_package})"
        )
    return path


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment (so the host's own index, proxy, credentials and CA settings
    apply) with the tools made non-interactive."""
    env = dict(os.environ)
    env.update(
        {
            "PIP_NO_INPUT": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "npm_config_update_notifier": "false",
            "npm_config_fund": "false",
            "npm_config_audit": "false",
        }
    )
    if extra:
        env.update(extra)
    return env


async def run_tool(
    argv: Sequence[str],
    *,
    timeout: float,
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ToolResult:
    """Run argv to its end and return its exit status and output (a non-zero status is the
    caller's to judge). PackageBuildError when it runs longer than timeout."""
    prefix = _death_signal_prefix()
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else tool_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        await _kill(proc)
        raise PackageBuildError(
            f"{what} took longer than {timeout:.0f} s and was stopped"
        ) from None
    except BaseException:
        await _kill(proc)
        raise
    assert proc.returncode is not None
    return ToolResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the tool's whole process group (pip and npm start children) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    await asyncio.shield(proc.wait())


def _death_signal_prefix() -> list[str]:
    """`setpriv --pdeathsig KILL` in front of a tool, where util-linux has it: a tool then dies
    with this process even when this process is killed (cancellation kills it otherwise)."""
    path = shutil.which("setpriv")
    return [path, "--pdeathsig", "KILL", "--"] if path else []
