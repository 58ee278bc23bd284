"""The JSON form of the public API (exec_sandbox/wire.py): every result type survives the round
trip through JSON text, error codes are stable and map back to the library's classes, and
run()/session() options cross as a body that RunRequest.make() then checks. No VM."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

import exec_sandbox as sbx
from exec_sandbox import errors, wire
from exec_sandbox.models import (
    ExecutionResult,
    ExposedPort,
    FileInfo,
    HttpRequestRecord,
    NetworkConnection,
    Output,
    PackagesReport,
    PortMapping,
    SessionSnapshot,
    Template,
    TimingBreakdown,
    ToolCall,
)
from exec_sandbox.processes import ProcessInfo
from exec_sandbox.volumes import Volume, VolumeMount


def _through_json(value: Any) -> Any:
    return json.loads(json.dumps(wire.encode(value)))


def test_an_execution_result_with_every_member_survives_json() -> None:
    result = ExecutionResult(
        stdout="out\u00e9",
        stderr="err",
        exit_code=3,
        execution_time_ms=12,
        timing=TimingBreakdown(1, 2, 3, 6, admission_ms=1, packages_ms=4),
        warm_pool_hit=True,
        exposed_ports=[ExposedPort(8000, 41234)],
        packages=PackagesReport(("six==1.16.0",), True, False, {"resolve": 5}, 99),
        network_log=[
            NetworkConnection(
                "outbound",
                "api.example.com",
                443,
                True,
                addresses=("192.0.2.1",),
                http_requests=(HttpRequestRecord("GET", "/v1", 200, secrets=("TOKEN",)),),
            )
        ],
        outputs=[Output("image/png", b"\x89PNG\r\n\x1a\n\x00\xff"), Output("text/plain", "42")],
        tool_calls=[ToolCall("add", '{"a": 1}', True, None, 3)],
    )
    assert wire.decode(ExecutionResult, _through_json(result)) == result


@pytest.mark.parametrize(
    "value",
    [
        SessionSnapshot("snap-1", "python", 256, 1.5, 1024, 2, ("six==1.16.0",)),
        Template("t", "sha256:ab", 10, {"python": "3.13"}, {"A": "1"}, "/w", 512, 2, "default"),
        FileInfo("a.txt", False, 3),
        ProcessInfo(7, "sleep 1", True, None, False, True, 0, 0),
        Volume("data", 64, 2.0),
    ],
    ids=lambda v: type(v).__name__,
)
def test_other_result_types_survive_json(value: Any) -> None:
    assert wire.decode(type(value), _through_json(value)) == value


def test_bytes_and_text_outputs_stay_apart() -> None:
    binary, text = _through_json([Output("image/png", b"abc"), Output("text/plain", "abc")])
    assert binary["data"] == {"base64": "YWJj"} and text["data"] == "abc"
    assert wire.decode(Output, binary).data == b"abc"
    assert wire.decode(Output, text).data == "abc"


def test_unknown_members_are_ignored_and_missing_ones_take_defaults() -> None:
    decoded = wire.decode(ExecutionResult, {"stdout": "", "stderr": "", "exit_code": 0, "new": 1})
    assert decoded == ExecutionResult("", "", 0)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"stdout": 1, "stderr": "", "exit_code": 0},
        {"stdout": "", "stderr": "", "exit_code": True},
        {"stdout": "", "stderr": "", "exit_code": 0, "outputs": [{"mime_type": "x", "data": 1}]},
        {"stdout": "", "stderr": "", "exit_code": 0, "outputs": "not a list"},
    ],
)
def test_answers_of_another_shape_are_refused(data: Any) -> None:
    with pytest.raises(ValueError):
        wire.decode(ExecutionResult, data)


def _public_errors() -> list[type[Exception]]:
    classes = [c for _, c in inspect.getmembers(sbx, inspect.isclass)]
    return [c for c in classes if issubclass(c, errors.SandboxError)]


def test_every_public_exception_has_its_own_code_and_comes_back_as_itself() -> None:
    seen: set[str] = set()
    for cls in _public_errors():
        code = wire.error_code(cls("boom"))
        assert code not in seen, f"{cls.__name__} shares the code {code}"
        seen.add(code)
        back = wire.exception_of(wire.error_body(code, "boom"), wire.error_status(code))
        assert type(back) is cls and str(back) == "boom", (cls, code)


def test_codes_are_the_class_names_in_snake_case() -> None:
    assert wire.error_code(errors.VmCapacityError("x")) == "vm_capacity"
    assert wire.error_code(errors.PackageNotAllowedError("x")) == "package_not_allowed"
    assert wire.error_code(sbx.NetworkValidationError("x")) == "network_validation"
    assert wire.error_code(RuntimeError("x")) == "internal"


@pytest.mark.parametrize(
    ("code", "status", "cls"),
    [
        ("code_validation", 400, errors.CodeValidationError),
        ("vm_capacity", 503, errors.VmCapacityError),
        ("session_closed", 409, errors.SessionClosedError),
        (wire.NOT_FOUND, 404, errors.SessionClosedError),
        (wire.UNAUTHORIZED, 401, errors.PermanentError),
        (wire.LIMIT_EXCEEDED, 429, errors.VmCapacityError),
        ("a_code_from_a_newer_server", 500, errors.SandboxError),
    ],
)
def test_status_and_client_class_of_a_code(code: str, status: int, cls: type[Exception]) -> None:
    assert wire.error_status(code) == status
    exc = wire.exception_of(wire.error_body(code, "m"), status)
    assert isinstance(exc, cls) and getattr(exc, "code", code) == code


def test_exceptions_keep_the_attributes_their_class_carries() -> None:
    failed = errors.TemplateBuildError("step 2 failed", step=2, exit_code=7, output="no such")
    exc = wire.exception_of(_through_json(wire.exception_body(failed)), 422)
    assert isinstance(exc, errors.TemplateBuildError)
    assert (exc.step, exc.exit_code, exc.output) == (2, 7, "no such")
    limited = errors.OutputLimitError("too much", stdout="kept", stderr="e")
    exc = wire.exception_of(_through_json(wire.exception_body(limited)), 400)
    assert isinstance(exc, errors.OutputLimitError) and (exc.stdout, exc.stderr) == ("kept", "e")


def test_an_answer_without_an_error_body_is_still_an_exception() -> None:
    assert isinstance(wire.exception_of("<html>", 502), errors.SandboxError)


def test_options_cross_as_json_and_come_back_as_the_callers_types() -> None:
    secret = sbx.Secret("TOKEN", "s3cret", hosts=["api.example.com"], replace_in_body="key")
    options: sbx.RunOptions = {
        "language": "python",
        "packages": ["six==1.16.0"],
        "timeout_seconds": 5,
        "allow_network": True,
        "allowed_domains": ["api.example.com"],
        "expose_ports": [8000, PortMapping(9000, 19000)],
        "secrets": [secret],
        "volumes": {
            "/mnt/a": "data",
            "/mnt/b": Volume("v", 1),
            "/mnt/c": VolumeMount("w", read_only=True),
        },
        "on_stdout": print,
        "env_vars": None,
    }
    body = json.loads(json.dumps(wire.options_to_wire(options)))
    assert "on_stdout" not in body and "env_vars" not in body
    assert body["secrets"][0]["value"] == "s3cret"
    back = wire.options_from_wire(body)
    assert back["expose_ports"] == [8000, PortMapping(9000, 19000)]
    assert back["secrets"] == [secret]
    assert back["volumes"] == {
        "/mnt/a": "data",
        "/mnt/b": "v",
        "/mnt/c": VolumeMount("w", read_only=True),
    }
    sbx.RunRequest.make(back, sbx.SchedulerConfig(), code=None)  # the one checker accepts it


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"langauge": "python"}, errors.InputValidationError),
        ({"tools": {}}, errors.InputValidationError),
        ({"secrets": [{"name": "T"}]}, sbx.NetworkValidationError),
        ({"expose_ports": [{"external": 1}]}, sbx.NetworkValidationError),
        ({"volumes": {"/a": 3}}, errors.InputValidationError),
    ],
)
def test_bad_option_bodies_are_input_errors(body: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        wire.options_from_wire(body)
