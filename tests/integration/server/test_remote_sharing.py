"""What only a remote client has: a session used by two clients with different tokens once it is
shared, attached by id, and what each client's close() does; a bad token fails at start(); one
client and its session handle outliving a restart of the server."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx", reason="the remote extra is not installed")

import asyncio
import signal
from pathlib import Path

from exec_sandbox import CommunicationError, PermanentError, SessionClosedError
from exec_sandbox.remote import RemoteScheduler

from .support import Server, running

pytestmark = pytest.mark.vm


async def test_a_shared_session_is_driven_by_both_tokens_and_outlives_the_guest_client(
    server: Server,
) -> None:
    url = f"http://127.0.0.1:{server.port}"
    alice = RemoteScheduler(url, server.token("alice-rmt"))
    bob = RemoteScheduler(url, server.token("bob-rmt"))
    async with alice, bob:
        session = await alice.session()
        await session.exec("x = 41")
        # Not shared yet: bob's token cannot even tell that it exists.
        with pytest.raises(SessionClosedError):
            await bob.attach(session.session_id)
        await session.share(["bob-rmt"])
        assert session.shared_with == ("bob-rmt",)
        attached = await bob.attach(session.session_id)
        assert (await attached.exec("print(x + 1)")).stdout == "42\n"
        assert attached.owner == "alice-rmt"
        await bob.close()  # bob attached, did not open: the session stays
        assert (await session.exec("print(x)")).stdout == "41\n"
    # alice's close() closed what she opened, on the server too (the socket sees every one).
    assert session.closed
    async with RemoteScheduler(server.socket) as admin:
        listed = [s for s in await admin.sessions() if s["id"] == session.session_id]
        assert all(s["closed"] for s in listed)


async def test_an_unknown_token_fails_at_start(server: Server) -> None:
    remote = RemoteScheduler(f"http://127.0.0.1:{server.port}", "sbx_not-a-token")
    with pytest.raises(PermanentError) as info:
        await remote.start()
    assert getattr(info.value, "code", "") == "unauthorized"
    await remote.close()


async def test_a_client_and_its_session_outlive_a_server_restart(tmp_path: Path) -> None:
    first = Server(tmp_path).start()
    try:
        remote = RemoteScheduler(first.socket)
        await remote.start()
        session = await remote.session()
        await session.exec("kept = 'across the restart'")
    finally:
        assert first.stop(signal.SIGTERM) == 0, first.log()
    # No server: a clear error, not a hang; the handle stays open (the server paused it).
    with pytest.raises(CommunicationError):
        await session.exec("print(kept)")
    assert not session.closed
    with running(tmp_path, state_dir=first.state_dir):
        # The same client object and handle: new connections, the same session id.
        assert (await session.exec("print(kept)")).stdout == "across the restart\n"
        await remote.close()
        assert session.closed


async def test_a_cancelled_session_call_leaves_no_session_on_the_server(server: Server) -> None:
    async with RemoteScheduler(server.socket) as remote:
        before = {s["id"] for s in await remote.sessions() if not s["closed"]}
        opening = asyncio.ensure_future(remote.session())
        await asyncio.sleep(0.05)  # sent: the server is starting its VM
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
    # close() waited for the server's answer and closed what it had opened; without that, the
    # session would appear once the server is done starting it (well within 3 s here).
    await asyncio.sleep(3)
    async with RemoteScheduler(server.socket) as check:
        assert {s["id"] for s in await check.sessions() if not s["closed"]} == before
