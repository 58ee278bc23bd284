"""exec-sandbox: run untrusted code in disposable QEMU microVMs on your own machine."""

from .config import SchedulerConfig
from .errors import (
    CodeValidationError,
    CommunicationError,
    CommunicationOutcomeUnknownError,
    EnvVarValidationError,
    GuestAgentError,
    InputValidationError,
    OutputLimitError,
    PackageBuildError,
    PackageNotAllowedError,
    PermanentError,
    SandboxError,
    SessionClosedError,
    SnapshotError,
    TransientError,
    VmCapacityError,
    VmConfigError,
    VmPermanentError,
    VmTimeoutError,
    VmTransientError,
)
from .models import ExecutionResult, ExposedPort, FileInfo, PortMapping, TimingBreakdown
from .scheduler import Scheduler

__all__ = [
    "CodeValidationError",
    "CommunicationError",
    "CommunicationOutcomeUnknownError",
    "EnvVarValidationError",
    "ExecutionResult",
    "ExposedPort",
    "FileInfo",
    "GuestAgentError",
    "InputValidationError",
    "OutputLimitError",
    "PackageBuildError",
    "PackageNotAllowedError",
    "PermanentError",
    "PortMapping",
    "SandboxError",
    "Scheduler",
    "SchedulerConfig",
    "SessionClosedError",
    "SnapshotError",
    "TimingBreakdown",
    "TransientError",
    "VmCapacityError",
    "VmConfigError",
    "VmPermanentError",
    "VmTimeoutError",
    "VmTransientError",
]
__version__ = "0.1.0"
