"""`sbx serve` as the tests run it: a subprocess on a tmp Unix socket and on a 127.0.0.1 port it
chose, with a tmp state directory and a small config; its clients (httpx over the socket or
TCP, websockets); and the check that it leaves no QEMU behind."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect, unix_connect

from exec_sandbox.server.tokens import TokenStore
from tests.helpers import qemu_processes

START_SECONDS = 60.0


class Server:
    def __init__(self, tmp: Path, *args: str, state_dir: Path | None = None) -> None:
        self.tmp = tmp
        self.state_dir = state_dir or tmp / "state"
        self.socket = tmp / "run" / "sbx.sock"
        self.args = args
        self.log_path = tmp / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.scheme = "http"
        self.qemu_seen: set[int] = set()

    def start(self) -> Server:
        env = {
            **os.environ,
            "EXEC_SANDBOX_STATE_DIR": str(self.state_dir),
            # Volumes are the user's data: the tests' stay in their tmp directory.
            "EXEC_SANDBOX_DATA_DIR": str(self.tmp / "data"),
        }
        argv = [sys.executable, "-m", "exec_sandbox.cli", "serve", "--socket", str(self.socket)]
        argv += ["--port", "0", "--max-vms", "3", "--warm-pool", "0", *self.args]
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env)
        finally:
            log.close()
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + START_SECONDS
        buffer = b""
        while not re.search(rb"https?://\S+\n", buffer):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"sbx serve did not start: {self.log()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                buffer += os.read(self.proc.stdout.fileno(), 4096)
        found = re.search(r"(https?)://(\S+)\n", buffer.decode())
        assert found is not None
        self.scheme = found.group(1)
        self.port = int(found.group(2).rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def qemus(self) -> list[int]:
        """The server's QEMU children now (remembered: stop() checks they are gone)."""
        found = qemu_processes(parent=self.pid)
        self.qemu_seen.update(found)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Signal the server, wait for it; assert no QEMU it had outlived it."""
        assert self.proc is not None
        self.qemus()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        deadline = time.monotonic() + 10
        while alive(self.qemu_seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(self.qemu_seen), f"QEMU outlived the server: {alive(self.qemu_seen)}"
        return code

    # --- clients ---

    def token(self, name: str, **options: Any) -> str:
        return TokenStore(self.state_dir).create(name, **options)

    def local(self) -> httpx.AsyncClient:
        """A client on the Unix socket (principal `local`, every scope)."""
        return httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
            base_url="http://sbx/v1",
            timeout=120,
        )

    def tcp(self, token: str | None, **options: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(
            base_url=f"{self.scheme}://127.0.0.1:{self.port}/v1",
            headers=headers,
            timeout=120,
            **options,
        )

    @contextlib.asynccontextmanager
    async def ws(
        self, path: str, token: str | None = None, *, max_queue: int = 16
    ) -> AsyncIterator[ClientConnection]:
        """A WebSocket to /v1{path}: on TCP with token, else on the Unix socket."""
        if token is None:
            url = f"ws://sbx/v1{path}"
            async with unix_connect(str(self.socket), url, max_queue=max_queue) as conn:
                yield conn
        else:
            headers = {"Authorization": f"Bearer {token}"}
            url = f"ws://127.0.0.1:{self.port}/v1{path}"
            async with connect(url, additional_headers=headers, max_queue=max_queue) as conn:
                yield conn


def alive(pids: set[int]) -> set[int]:
    """Those of pids still running (not zombies)."""
    found = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.add(pid)
    return found


@contextlib.contextmanager
def running(tmp: Path, *args: str, state_dir: Path | None = None) -> Iterator[Server]:
    server = Server(tmp, *args, state_dir=state_dir).start()
    try:
        yield server
    finally:
        server.stop()
