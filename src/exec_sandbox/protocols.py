"""What every scheduler and every session offers, whatever runs the VMs: `SandboxScheduler` is
satisfied by `Scheduler` (this host) and `cluster.ClusterScheduler` (many hosts), and
`SandboxSession` by `Session` and `cluster.ClusterSession`. The integrations take these, so one
integration works over either; tests/unit/test_protocols.py checks both pairs under mypy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, Self, Unpack, runtime_checkable

from .config import SchedulerConfig
from .models import ExecutionResult, FileInfo, Language, PackagesReport, SessionSnapshot
from .run_request import RunOptions
from .vm.execution import OutputCallback


@runtime_checkable
class SandboxSession(Protocol):
    """A live VM whose REPL keeps its state between exec() calls (the public `Session`)."""

    @property
    def session_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def close_reason(self) -> str: ...

    @property
    def exec_count(self) -> int: ...

    async def exec(
        self,
        code: str,
        *,
        timeout_seconds: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecutionResult: ...

    async def write_file(
        self, path: str, content: bytes | Path | IO[bytes], *, make_executable: bool = False
    ) -> None: ...

    async def read_file(
        self, path: str, *, destination: Path | IO[bytes] | None = None
    ) -> bytes | None: ...

    async def list_files(self, path: str = "") -> list[FileInfo]: ...

    async def install(
        self, packages: Sequence[str], *, timeout_seconds: float | None = None
    ) -> PackagesReport: ...

    async def pause(self) -> SessionSnapshot: ...

    async def fork(self, count: int | None = None) -> SandboxSession | Sequence[SandboxSession]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class SandboxScheduler(Protocol):
    """Runs code in disposable VMs and opens sessions (the public `Scheduler`)."""

    @property
    def config(self) -> SchedulerConfig: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, code: str, **options: Unpack[RunOptions]) -> ExecutionResult: ...

    async def session(
        self, *, _packages_language: Language | None = None, **options: Unpack[RunOptions]
    ) -> SandboxSession: ...

    async def resume(
        self,
        snapshot_id: str | SessionSnapshot,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> SandboxSession: ...

    async def snapshots(self) -> list[SessionSnapshot]: ...

    async def delete_snapshot(self, snapshot_id: str | SessionSnapshot) -> bool: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
