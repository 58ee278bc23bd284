"""The exception hierarchy is public API (documented in exec_sandbox/errors.py): names and parents
must not change."""

from __future__ import annotations

import exec_sandbox as sbx


def test_hierarchy_matches_the_contract() -> None:
    expected = {
        "TransientError": "SandboxError",
        "VmTransientError": "TransientError",
        "VmTimeoutError": "VmTransientError",
        "VmCapacityError": "TransientError",
        "PermanentError": "SandboxError",
        "VmPermanentError": "PermanentError",
        "VmConfigError": "PermanentError",
        "SnapshotError": "PermanentError",
        "TemplateError": "PermanentError",
        "TemplateBuildError": "TemplateError",
        "VolumeError": "PermanentError",
        "VolumeInUseError": "TransientError",
        "InputValidationError": "SandboxError",
        "CodeValidationError": "InputValidationError",
        "EnvVarValidationError": "InputValidationError",
        "PackageNotAllowedError": "InputValidationError",
        "OutputLimitError": "SandboxError",
        "SessionClosedError": "SandboxError",
        "CommunicationError": "SandboxError",
        "CommunicationOutcomeUnknownError": "CommunicationError",
        "GuestAgentError": "CommunicationError",
    }
    for name, parent in expected.items():
        cls = getattr(sbx, name)
        assert issubclass(cls, getattr(sbx, parent)), f"{name} should derive from {parent}"
        assert cls.__mro__[1].__name__ == parent, f"{name}'s direct parent is not {parent}"


def test_output_limit_error_keeps_the_partial_output_through_pickle() -> None:
    import pickle

    exc = sbx.OutputLimitError("stdout exceeded 1048576 bytes", stdout="x" * 10, stderr="warn\n")
    copy = pickle.loads(pickle.dumps(exc))
    assert (str(copy), copy.stdout, copy.stderr) == (str(exc), "x" * 10, "warn\n")
