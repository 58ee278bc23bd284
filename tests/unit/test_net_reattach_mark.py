"""skip_to_reattach_mark (network/attach.py) on a socketpair standing in for the net port: what
a restored guest had queued for its old host is skipped, the frames after its mark are left for
the relay, and a guest that never sends the mark fails the attach."""

from __future__ import annotations

import socket

import pytest

from exec_sandbox.errors import CommunicationError
from exec_sandbox.network import attach
from exec_sandbox.network.attach import REATTACH_MARK, skip_to_reattach_mark


async def test_stale_bytes_are_skipped_up_to_the_mark() -> None:
    host, guest = socket.socketpair()
    with host, guest:
        stale = b"\x40\x00\x00\x00" + b"a frame cut by the save" + REATTACH_MARK[:10]
        after = b"\x04\x00\x00\x00frame after the mark"
        guest.sendall(stale * 1500 + REATTACH_MARK + after)  # more than one peek (64 KiB)
        await skip_to_reattach_mark(host.fileno())
        assert host.recv(1000) == after


async def test_no_mark_fails_the_attach(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attach, "_MARK_TIMEOUT_SECONDS", 0.2)
    host, guest = socket.socketpair()
    with host, guest:
        guest.sendall(b"x" * 100)
        with pytest.raises(CommunicationError, match="in time"):
            await skip_to_reattach_mark(host.fileno())
        monkeypatch.setattr(attach, "_STALE_MAX", 1000)
        guest.sendall(b"y" * 5000)
        with pytest.raises(CommunicationError, match="no reattach mark"):
            await skip_to_reattach_mark(host.fileno())
        guest.close()
        host.recv(100000)
        with pytest.raises(CommunicationError, match="closed"):
            await skip_to_reattach_mark(host.fileno())
