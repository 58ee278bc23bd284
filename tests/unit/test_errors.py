"""The exception hierarchy is the one documented in docs/api.md."""

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
