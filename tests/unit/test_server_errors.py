"""How `sbx serve` answers failures (server/errors.py over exec_sandbox.wire), no VM: each
library exception by its stable code and HTTP status, the server's own codes, and no traceback
or message of an unexpected exception in the answer."""

from __future__ import annotations

import pytest

from exec_sandbox import errors, wire
from exec_sandbox.server.errors import error_of
from exec_sandbox.server.hub import HubError


@pytest.mark.parametrize(
    ("exc", "code", "status"),
    [
        (errors.VmCapacityError("full"), "vm_capacity", 503),
        (errors.SessionClosedError("gone"), "session_closed", 409),
        (errors.PackageNotAllowedError("no"), "package_not_allowed", 400),
        (errors.InputValidationError("bad"), "input_validation", 400),
        (errors.CommunicationOutcomeUnknownError("?"), "communication_outcome_unknown", 502),
        (errors.VmTimeoutError("slow"), "vm_timeout", 503),
        (FileNotFoundError("nope in the guest home"), "file_not_found", 404),
        (HubError(wire.NOT_FOUND, "no session x"), "not_found", 404),
        (HubError(wire.FORBIDDEN, "admin only"), "forbidden", 403),
        (HubError(wire.LIMIT_EXCEEDED, "too many"), "limit_exceeded", 429),
        (ValueError("unreadable"), "bad_request", 400),
        (ProcessLookupError("process 7: no such process"), "not_found", 404),
    ],
)
def test_exception_maps_to_code_and_status(exc: Exception, code: str, status: int) -> None:
    got_status, body = error_of(exc)
    assert (got_status, body["error"]["code"]) == (status, code)
    assert body["error"]["message"]


def test_template_build_error_carries_step_and_exit_code() -> None:
    _, body = error_of(errors.TemplateBuildError("step 2 failed", step=2, exit_code=3))
    assert body["error"]["code"] == "template_build"
    assert body["error"]["details"]["step"] == 2
    assert body["error"]["details"]["exit_code"] == 3


def test_unexpected_exception_is_internal_without_its_message() -> None:
    status, body = error_of(KeyError("secret-internal-detail"))
    assert status == 500 and body["error"]["code"] == "internal"
    assert "secret-internal-detail" not in body["error"]["message"]


def test_client_gets_the_library_class_back() -> None:
    for exc in (errors.VmCapacityError("x"), FileNotFoundError("y"), errors.OutputLimitError("z")):
        status, body = error_of(exc)
        assert type(wire.exception_of(body, status)) is type(exc)
