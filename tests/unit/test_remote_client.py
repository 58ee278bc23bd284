"""RemoteScheduler without a server: where it connects, and that bad input is refused with the
library's InputValidationError before anything is sent (the address below has no server, so a
call that got as far as the network would raise CommunicationError instead)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_sandbox import (
    CommunicationError,
    EnvVarValidationError,
    InputValidationError,
    PackageNotAllowedError,
)
from exec_sandbox.remote import RemoteScheduler
from exec_sandbox.remote._connection import Endpoint


def test_a_path_or_unix_url_is_the_socket_and_http_is_tcp(tmp_path: Path) -> None:
    assert Endpoint.parse(tmp_path / "s.sock").socket_path == str(tmp_path / "s.sock")
    assert Endpoint.parse("unix:///run/sbx.sock").socket_path == "/run/sbx.sock"
    tcp = Endpoint.parse("http://127.0.0.1:8642")
    assert (tcp.socket_path, tcp.base_url, tcp.ws_base) == (
        None,
        "http://127.0.0.1:8642",
        "ws://127.0.0.1:8642",
    )
    assert Endpoint.parse("https://sbx.example:443/").ws_base == "wss://sbx.example:443"


def test_no_address_is_the_servers_default_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    assert RemoteScheduler().endpoint.socket_path == "/run/user/4242/exec-sandbox/sbx.sock"


@pytest.mark.parametrize(
    "target", ["", "ftp://host", "unix://relative", "http://host:1/v1", "http://"]
)
def test_other_addresses_are_refused(target: str) -> None:
    with pytest.raises(InputValidationError):
        RemoteScheduler(target)


def test_the_token_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXEC_SANDBOX_TOKEN", "from-env")
    assert RemoteScheduler("http://127.0.0.1:1")._token == "from-env"
    assert RemoteScheduler("http://127.0.0.1:1", "given")._token == "given"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"language": "cobol"}, InputValidationError),
        ({"env_vars": {"BAD=NAME": "x"}}, EnvVarValidationError),
        ({"packages": ["requests"]}, PackageNotAllowedError),
        ({"timeout_seconds": 0.0001}, InputValidationError),
        ({"tools": {"f": len}}, InputValidationError),
    ],
)
async def test_bad_run_options_raise_before_any_request(
    tmp_path: Path, options: dict[str, object], error: type[Exception]
) -> None:
    remote = RemoteScheduler(tmp_path / "none.sock")
    with pytest.raises(error):
        await remote.run("print(1)", **options)  # type: ignore[arg-type]
    with pytest.raises(error):
        await remote.session(**options)  # type: ignore[arg-type]
    await remote.close()


async def test_tools_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    remote = RemoteScheduler(tmp_path / "none.sock")
    with pytest.raises(InputValidationError, match="host tools"):
        await remote.run("print(1)", tools={"f": len})


async def test_a_valid_call_without_a_server_is_a_communication_error(tmp_path: Path) -> None:
    remote = RemoteScheduler(tmp_path / "none.sock")
    with pytest.raises(CommunicationError, match="cannot reach the server"):
        await remote.run("print(1)")
    await remote.close()
