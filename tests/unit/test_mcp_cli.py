"""`sbx mcp`'s arguments: mistakes are usage errors (exit 2, a message on stderr) before any
scheduler starts; stdout, the protocol's channel, stays empty."""

from __future__ import annotations

import pytest

from exec_sandbox.cli.main import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-sessions", "0"], "--max-sessions must be at least 1"),
        (["--token-env", "T"], "--token-env goes with --server"),
        (["--server", "/tmp/s.sock", "--max-vms", "2"], "--max-vms: the server decides"),
        (["--allow-domain", "bad name"], "white space"),
        (["--memory", "1"], "memory"),
    ],
)
def test_bad_arguments_are_usage_errors_before_any_vm(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mcp", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


def test_a_token_variable_that_is_not_set_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SBX_TEST_TOKEN", raising=False)
    assert main(["mcp", "--server", "http://127.0.0.1:1", "--token-env", "SBX_TEST_TOKEN"]) == 2
    assert "SBX_TEST_TOKEN: that variable is not set" in capsys.readouterr().err
