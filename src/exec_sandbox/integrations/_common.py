"""What the integrations share: turning a result into text for a model, and sessions kept per
conversation key (thread id, execution id) on a Runner's scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, get_args

from exec_sandbox import ExecutionResult, SandboxError, SandboxScheduler, SnapshotError
from exec_sandbox.host_tools import ToolFunction
from exec_sandbox.models import LANGUAGE_ALIASES
from exec_sandbox.network import parse_network_request
from exec_sandbox.network.secrets import Secret

from ._bridge import Runner
from ._outputs import outputs_artifact, outputs_text

if TYPE_CHECKING:
    from exec_sandbox import SandboxSession

log = logging.getLogger("exec_sandbox")
# What the models may ask for; the LangChain tool puts it in its args schema as an enum.
# TypeScript ("typescript", "ts") runs in the javascript runtime: runtime_language().
LanguageName = Literal["python", "javascript", "typescript", "ts", "raw"]
LANGUAGES: tuple[str, ...] = get_args(LanguageName)


def runtime_language(language: str) -> str:
    """The runtime a language name runs in ("typescript" and "ts": "javascript"), so that a
    model's TypeScript and JavaScript calls share one session and one set of tool bindings."""
    return LANGUAGE_ALIASES.get(language, language)


def result_text(result: ExecutionResult, note: str = "") -> str:
    """What a model reads: a sandbox note if any (ended_note, alone_note), stdout, the rich
    outputs (a cell's value, display()ed objects, figures named), then stderr, then the exit
    code when it is not 0."""
    parts = [note] if note else []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.outputs:
        parts.append(outputs_text(result.outputs))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.exit_code != 0:
        parts.append(f"exit code: {result.exit_code}")
    return "\n".join(parts) if parts else "(no output)"


def ended_note(previous: SandboxSession, *, resumed: bool) -> str:
    """What the model is told when the session behind its key ended since its last call (idle
    timeout, VM crash, OOM) and the call ran in another: without it the model would take the
    missing variables for a bug in its own code."""
    reason = previous.close_reason or "it was closed"
    if resumed:
        return (
            f"[sandbox note: the previous session ended ({reason}); this call ran in the "
            "sandbox as it was last saved, so changes made after that are gone]"
        )
    return (
        f"[sandbox note: the previous session ended ({reason}); this call ran in a new one, so "
        "variables and files from earlier calls are gone]"
    )


def alone_note(missing: str) -> str:
    """What the model is told when its call had no conversation key: it ran in a sandbox of its
    own rather than in one shared by every caller without a key."""
    return (
        f"[sandbox note: no {missing} was given, so this call ran in a sandbox of its own, now "
        "gone; nothing from it persists to the next call]"
    )


def result_artifact(result: ExecutionResult) -> dict[str, Any]:
    """The structured side of a result, for frameworks that carry one beside the text."""
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "execution_time_ms": result.execution_time_ms,
        "timing": {
            "setup_ms": result.timing.setup_ms,
            "boot_ms": result.timing.boot_ms,
            "execute_ms": result.timing.execute_ms,
            "total_ms": result.timing.total_ms,
        },
        "outputs": outputs_artifact(result.outputs),
        "tool_calls": [
            {"name": c.name, "ok": c.ok, "error": c.error, "duration_ms": c.duration_ms}
            for c in result.tool_calls
        ],
    }


class SavedSessions:
    """Paused sessions by conversation key (a thread id, an execution id), so that a key's sandbox
    outlives its process: save() pauses a key's session and remembers its snapshot, resume()
    gives the session back, here or in a later process. The index is one small owner-only file
    per key beside the snapshots; a key's older snapshot is deleted when a newer one replaces it."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def _entry(self, scheduler: SandboxScheduler, key: str) -> Path:
        name = hashlib.sha256(f"{self.namespace}\0{key}".encode()).hexdigest()[:32]
        return scheduler.config.memory_snapshot_cache_dir / "sessions" / "keys" / f"{name}.json"

    async def save(self, scheduler: SandboxScheduler, key: str, session: SandboxSession) -> None:
        snapshot = await session.pause()
        entry = self._entry(scheduler, key)
        previous = _read_id(entry)
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"namespace": self.namespace, "key": key, "id": snapshot.id}, f)
        os.replace(tmp, entry)
        if previous and previous != snapshot.id:
            with contextlib.suppress(SnapshotError):
                await scheduler.delete_snapshot(previous)

    async def resume(self, scheduler: SandboxScheduler, key: str) -> SandboxSession | None:
        """The key's saved session, or None (never saved, or it cannot be resumed any more:
        expired, damaged, other images)."""
        entry = self._entry(scheduler, key)
        snapshot_id = _read_id(entry)
        if snapshot_id is None:
            return None
        try:
            return await scheduler.resume(snapshot_id)
        except SnapshotError as exc:
            log.warning("the saved session of %s cannot be resumed (%s): starting afresh", key, exc)
            entry.unlink(missing_ok=True)
            return None

    async def forget(self, scheduler: SandboxScheduler, key: str) -> None:
        """Delete the key's saved session, if any."""
        entry = self._entry(scheduler, key)
        snapshot_id = _read_id(entry)
        if snapshot_id is not None:
            with contextlib.suppress(SnapshotError):
                await scheduler.delete_snapshot(snapshot_id)
        entry.unlink(missing_ok=True)


def _read_id(entry: Path) -> str | None:
    try:
        value = json.loads(entry.read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


class NetworkOptions(TypedDict):
    """The network part of RunOptions, as an integration's settings give it."""

    allow_network: bool
    allowed_domains: Sequence[str] | None
    secrets: NotRequired[Sequence[Secret] | None]
    http_headers: NotRequired[Mapping[str, Mapping[str, str]] | None]


def network_options(
    allow_network: bool,
    allowed_domains: Sequence[str] | None,
    secrets: Sequence[Secret] | None = None,
    http_headers: Mapping[str, Mapping[str, str]] | None = None,
) -> NetworkOptions:
    """The network keyword arguments of run()/session() for an integration's settings, validated
    at once (NetworkValidationError), so that a bad setting fails when the tool is made."""
    parse_network_request(allow_network, allowed_domains, None, secrets, http_headers)
    options: NetworkOptions = {
        "allow_network": allow_network,
        "allowed_domains": list(allowed_domains) if allowed_domains is not None else None,
    }
    if secrets:
        options["secrets"] = list(secrets)
    if http_headers:
        options["http_headers"] = {host: dict(rule) for host, rule in http_headers.items()}
    return options


class SessionPool:
    """One live Session per key, opened on first use, reopened if it closed (idle timeout, VM
    death). Every coroutine runs through the Runner, so the sessions live on one loop."""

    def __init__(
        self,
        runner: Runner,
        *,
        language: str = "python",
        timeout_seconds: int | None = None,
        packages: Sequence[str] | None = None,
        persist: str | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        secrets: Sequence[Secret] | None = None,
        http_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """persist: a namespace under which closing pauses each key's session to disk and a
        later get() of the key (also in a new process) resumes it (SavedSessions; a resumed
        session has no secrets: they are never saved). allow_network / allowed_domains /
        secrets / http_headers: as Scheduler.session() (checked here, before any VM)."""
        self.runner = runner
        self._saved = SavedSessions(persist) if persist else None
        self.language = runtime_language(language)
        self.timeout_seconds = timeout_seconds
        self.packages = list(packages) if packages else None
        self.network = network_options(allow_network, allowed_domains, secrets, http_headers)
        self._sessions: dict[str, SandboxSession] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        # Per key, the note for the next result when its session ended behind the model's back.
        self._notes: dict[str, str] = {}

    async def get(
        self,
        scheduler: SandboxScheduler,
        key: str,
        *,
        tools: Mapping[str, ToolFunction] | None = None,
    ) -> SandboxSession:
        """The key's live session, opened (with `tools`, which a live one keeps) if it has none."""
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            session = self._sessions.get(key)
            if session is not None and not session.closed:
                return session
            # Sessions we close are dropped from _sessions: a closed one here ended on its own.
            ended = session
            session = None
            if self._saved is not None:
                session = await self._saved.resume(scheduler, key)
            if session is None:
                session = await self.open(scheduler, tools=tools)
            elif ended is not None:
                self._notes[key] = ended_note(ended, resumed=True)
            if ended is not None and key not in self._notes:
                self._notes[key] = ended_note(ended, resumed=False)
            self._sessions[key] = session
            return session

    async def open(
        self,
        scheduler: SandboxScheduler,
        *,
        tools: Mapping[str, ToolFunction] | None = None,
    ) -> SandboxSession:
        """A new session with the pool's settings (and the host `tools` its code may call), kept
        under no key."""
        return await scheduler.session(
            language=self.language,  # type: ignore[arg-type]
            timeout_seconds=self.timeout_seconds,
            packages=self.packages,
            tools=tools,
            **self.network,
        )

    def take_note(self, key: str) -> str:
        """The note owed to the key's next result (ended_note), once; "" when there is none."""
        return self._notes.pop(key, "")

    async def exec(
        self, scheduler: SandboxScheduler, key: str | None, code: str, *, missing: str
    ) -> tuple[ExecutionResult, str]:
        """Run code in the key's session; the result and the note the model should read with it.
        Without a key (`missing` names it) the code runs in a session of its own, closed after:
        callers without a key never share one VM."""
        if key is None:
            session = await self.open(scheduler)
            try:
                return await session.exec(code), alone_note(missing)
            finally:
                await session.close()
        session = await self.get(scheduler, key)
        return await session.exec(code), self.take_note(key)

    def sessions(self) -> list[SandboxSession]:
        """The live sessions, of every key."""
        return [session for session in self._sessions.values() if not session.closed]

    def keys(self) -> list[str]:
        return [key for key, session in self._sessions.items() if not session.closed]

    async def _close(self, scheduler: SandboxScheduler, key: str | None) -> None:
        keys = list(self._sessions) if key is None else [key]
        for name in keys:
            session = self._sessions.pop(name, None)
            if session is None or session.closed:
                continue
            if self._saved is None:
                await session.close()
                continue
            try:
                await self._saved.save(scheduler, name, session)
            except SandboxError as exc:
                log.warning("saving the session of %s failed (%s): it is closed", name, exc)
                await session.close()

    def close(self, key: str | None = None) -> None:
        """Close one key's session, or all of them. Idempotent."""
        if self._sessions:
            self.runner.run(lambda s: self._close(s, key))

    async def aclose(self, key: str | None = None) -> None:
        if self._sessions:
            await self.runner.arun(lambda s: self._close(s, key))
