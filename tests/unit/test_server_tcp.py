"""The server's TCP listener hands out connections without Nagle's delay: a response written
in two parts (head, then body) must not wait for the client's delayed ACK."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")

from exec_sandbox.server.serve import bind_tcp


def test_accepted_tcp_connections_have_nodelay() -> None:
    listener = bind_tcp("127.0.0.1", 0)
    listener.setblocking(True)
    with listener, socket.create_connection(listener.getsockname()[:2]) as client:
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert client is not None
