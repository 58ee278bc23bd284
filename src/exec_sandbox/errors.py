"""The exception hierarchy of exec-sandbox: part of the public API (names and parents are pinned by
tests/unit/test_errors.py).

Transient errors happened before the code was dispatched and are safe to retry; permanent errors
will fail again with the same configuration; input validation errors are the caller's bug and
leave a session usable.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error this library raises."""


class TransientError(SandboxError):
    """A failure that may go away when retried."""


class VmTransientError(TransientError):
    """The VM failed before the code was dispatched: the code never ran, retrying is safe."""


class VmTimeoutError(VmTransientError):
    """The VM did not become ready in time."""


class VmCapacityError(TransientError):
    """Admission control refused the request: too many VMs for this host's budget."""


class PermanentError(SandboxError):
    """A failure that will repeat with the same configuration."""


class VmPermanentError(PermanentError):
    """The VM cannot be started on this host (missing QEMU, images, ...)."""


class VmConfigError(PermanentError, ValueError):
    """A configuration value is invalid."""


class SnapshotError(PermanentError):
    """A memory or disk snapshot could not be created or restored."""


class TemplateError(PermanentError):
    """A template cannot be made or used as asked: its image could not be imported (unknown
    registry or tag, a blob that does not match its digest, another architecture, over the size
    cap), skopeo is missing, or no template has that name. The message says which."""


class TemplateBuildError(TemplateError):
    """A template's build failed. step: the index of the failing step in the steps given (None:
    preparing the tree or finishing the image); output: what the step printed (its last part);
    exit_code: its exit status (None when it did not exit: timed out, the VM died)."""

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        output: str = "",
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.output = output
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[object, ...]:
        # Pickle (e.g. across processes) with the step's details: the default uses args only.
        state = {"step": self.step, "output": self.output, "exit_code": self.exit_code}
        return (type(self), self.args, state)


class VolumeError(PermanentError):
    """A volume cannot be made or used as asked: no volume of that name, one of another size,
    an image the host cannot open. The message says which."""


class VolumeInUseError(TransientError):
    """A volume is attached in a mode that excludes the one asked for (read-write needs it
    alone; read-only shares it with other readers), or is to be deleted while attached. Nothing
    started: retry once the other sandbox is closed."""


class InputValidationError(SandboxError, ValueError):
    """The caller passed invalid input; nothing was sent to any VM."""


class CodeValidationError(InputValidationError):
    """The code (or the language) is not acceptable."""


class EnvVarValidationError(InputValidationError):
    """An environment variable name or value is not acceptable."""


class PackageNotAllowedError(InputValidationError):
    """A requested package is unpinned or not allowed, or cannot be installed in the sandbox: not
    on the index, no wheel for the guest's platform, conflicting versions. Raised before any VM
    starts; the message names the package."""


class PackageBuildError(TransientError):
    """Building a package layer failed for a reason other than the request itself (the package
    index could not be reached, a build step failed). No code ran: safe to retry."""


class OutputLimitError(SandboxError):
    """The code wrote more than the stdout (1 MB) or stderr (100 KB) limit. The code was ended;
    what it wrote up to the limit is kept in `stdout` and `stderr`."""

    def __init__(self, message: str, *, stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr

    def __reduce__(self) -> tuple[object, ...]:
        # Pickle (e.g. across processes) with the output: the default uses args only.
        return (type(self), self.args, {"stdout": self.stdout, "stderr": self.stderr})


class SessionClosedError(SandboxError):
    """The session is closed; open a new one."""


class CommunicationError(SandboxError):
    """The channel to the guest agent failed."""


class CommunicationOutcomeUnknownError(CommunicationError):
    """The channel was lost after the code was dispatched: it may or may not have run."""


class GuestAgentError(CommunicationError):
    """The guest agent reported an error or broke the protocol."""
