"""What only a remote client has: a session used by two clients with different tokens once it is
shared, attached by id, and what each client's close() does; a bad token fails at start()."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx", reason="the remote extra is not installed")

from exec_sandbox import PermanentError, SessionClosedError
from exec_sandbox.remote import RemoteScheduler

from .support import Server

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
