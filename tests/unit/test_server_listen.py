"""Where `sbx serve` listens (server/serve.py), no VM: a non-loopback address without TLS is
warned about, TLS needs both files, the Unix socket is private, a stale socket is replaced and
a live one refused."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from exec_sandbox.server.serve import ServeError, ServeOptions, bind_unix, check_address


def _warnings(options: ServeOptions) -> list[str]:
    said: list[str] = []
    check_address(options, said.append)
    return said


def test_non_loopback_without_tls_is_warned_about() -> None:
    assert _warnings(ServeOptions(socket_path=None, port=8765, host="127.0.0.1")) == []
    assert _warnings(ServeOptions(socket_path=None, port=8765, host="::1")) == []
    said = _warnings(ServeOptions(socket_path=None, port=8765, host="10.1.2.3"))
    assert len(said) == 1 and "clear text" in said[0]
    tls = ServeOptions(
        socket_path=None, port=8765, host="10.1.2.3", tls_cert=Path("c"), tls_key=Path("k")
    )
    assert _warnings(tls) == []


def test_tls_needs_both_files() -> None:
    with pytest.raises(ServeError):
        check_address(ServeOptions(socket_path=None, port=1, tls_cert=Path("c")), print)


def test_socket_is_private_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "run" / "sbx.sock"
    first = bind_unix(path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        with pytest.raises(ServeError, match="already listening"):
            bind_unix(path)  # a live one: refused
    finally:
        first.close()  # the file stays, as after SIGKILL
    assert path.exists()
    second = bind_unix(path)
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
    finally:
        second.close()


def test_a_file_that_is_not_a_socket_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "sbx.sock"
    path.write_text("mine")
    with pytest.raises(ServeError, match="not a socket"):
        bind_unix(path)
    assert path.read_text() == "mine"


def test_a_socket_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    with pytest.raises(ServeError, match="writable by other users"):
        bind_unix(shared / "sbx.sock")
    assert not (shared / "sbx.sock").exists()
    shared.chmod(0o755)
    bind_unix(shared / "sbx.sock").close()
