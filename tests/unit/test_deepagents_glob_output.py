"""The Deep Agents backend's glob reads the guest's JSON lines as untrusted input: well-formed
records become FileInfo, anything else is a GlobResult error or a flagged partial result, never
an exception and never more than MAX_MATCHES entries."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("deepagents", reason="the deepagents extra is not installed")

from deepagents.backends.protocol import ExecuteResponse

from exec_sandbox.integrations._sandbox_glob import (
    MAX_MATCHES,
    MAX_PATH_CHARS,
    glob_command,
    parse_glob_output,
)


def _response(*lines: object, exit_code: int = 0, truncated: bool = False) -> ExecuteResponse:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    return ExecuteResponse(output=text, exit_code=exit_code, truncated=truncated)


def test_records_become_file_infos_and_done_carries_the_reason() -> None:
    result = parse_glob_output(
        _response(
            {
                "path": "a.py",
                "is_dir": False,
                "size": 3,
                "modified_at": "2026-01-01T00:00:00+00:00",
            },
            {"path": "sub", "is_dir": True, "size": True, "modified_at": 5},
            {"done": "unreadable"},
        )
    )
    assert result.error is None
    assert result.matches == [
        {"path": "a.py", "is_dir": False, "size": 3, "modified_at": "2026-01-01T00:00:00+00:00"},
        {"path": "sub", "is_dir": True},
    ]
    assert result.truncated and result.truncation_reason == "unreadable"
    clean = parse_glob_output(_response({"done": None}))
    assert clean.matches == [] and not clean.truncated and clean.truncation_reason is None
    odd = parse_glob_output(_response({"done": "because"}))
    assert odd.matches == [] and not odd.truncated


@pytest.mark.parametrize(
    "bad",
    [
        "Traceback (most recent call last):",
        "[1, 2]",
        json.dumps({"path": "", "is_dir": False}),
        json.dumps({"path": "x" * (MAX_PATH_CHARS + 1), "is_dir": False}),
        json.dumps({"path": "a\x00b", "is_dir": False}),
        json.dumps({"path": 7, "is_dir": False}),
        json.dumps({"path": "a", "is_dir": "yes"}),
    ],
)
def test_a_malformed_line_is_an_error_not_a_match(bad: str) -> None:
    result = parse_glob_output(_response({"path": "ok", "is_dir": False}, bad, {"done": None}))
    assert result.matches is None and result.error is not None
    assert result.error.startswith("glob failed")
    assert len(result.error) < 400


def test_guest_errors_timeouts_and_missing_end_are_errors() -> None:
    reported = parse_glob_output(_response({"error": "not a directory: /x"}))
    assert reported.error == "glob failed: not a directory: /x"
    message = "\nError: the command timed out after 30 seconds"
    timed_out = parse_glob_output(_response(message, exit_code=124))
    assert timed_out.error is not None and "timed out" in timed_out.error
    cut = parse_glob_output(_response({"path": "a", "is_dir": False}, exit_code=137))
    assert cut.error is not None and "137" in cut.error


def test_transport_truncation_keeps_what_arrived() -> None:
    torn = parse_glob_output(
        _response({"path": "a", "is_dir": False}, '{"path": "b", "is_', truncated=True)
    )
    assert torn.matches == [{"path": "a", "is_dir": False}]
    assert torn.truncated and torn.truncation_reason == "transport"


def test_no_more_than_max_matches_are_read() -> None:
    flood = [{"path": f"f{i}", "is_dir": False} for i in range(MAX_MATCHES + 50)]
    result = parse_glob_output(_response(*flood, {"done": None}))
    assert result.matches is None and result.error is not None


def test_unpassable_arguments_are_refused_before_the_vm() -> None:
    assert glob_command("", "/") is None
    assert glob_command("a\x00b", "/") is None
    assert glob_command("*", "/tmp\x00") is None
    assert glob_command("x" * 2000, "/") is None
    command = glob_command("*.py", "/tmp/it's here")
    assert command is not None and command.startswith("python3 -c ")
