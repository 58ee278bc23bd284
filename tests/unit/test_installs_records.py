"""What the host keeps of installs into a running VM (installs.py) and what it sends back:
records read from a paused session's meta are checked, messages name no index URL."""

from __future__ import annotations

import pytest

from exec_sandbox.installs import RuntimeLayer, runtime_from_meta, runtime_to_meta
from exec_sandbox.packages.tools import redact_urls


def test_records_round_trip_through_meta() -> None:
    layers = (
        RuntimeLayer("install-python-abc", "python", ("six==1.16.0",), 4096),
        RuntimeLayer("install-javascript-def", "javascript", ("a@1.0.0",), 512, ("a@1.0.0",)),
    )
    assert runtime_from_meta(runtime_to_meta(layers)) == layers
    assert runtime_from_meta(None) == ()


@pytest.mark.parametrize(
    "value",
    [
        "not a list",
        [{"key": "k", "kind": "ruby", "packages": [], "size": 1}],
        [{"key": "k", "kind": "python", "packages": ["six"], "size": 1}],
        [{"key": "k", "kind": "python", "packages": ["six==1"], "size": True}],
        [{"key": 1, "kind": "python", "packages": [], "size": 1}],
        [{"key": "k", "kind": "javascript", "packages": ["a@1"], "size": 1, "requested": [1]}],
    ],
)
def test_a_malformed_record_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        runtime_from_meta(value)


def test_index_urls_are_redacted_from_what_goes_back_to_the_vm() -> None:
    line = (
        "ERROR: Could not fetch URL https://user:token@private.example/simple/six/: "
        "connection refused (http://10.0.0.1:3141/root/pypi)"
    )
    redacted = redact_urls(line)
    assert "token" not in redacted and "private.example" not in redacted
    assert "10.0.0.1" not in redacted
    assert redacted.count("<index>") == 2
