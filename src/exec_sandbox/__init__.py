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
from .models import (
    ExecutionResult,
    ExposedPort,
    FileInfo,
    NetworkConnection,
    Output,
    PackagesReport,
    PortMapping,
    SessionSnapshot,
    TimingBreakdown,
    ToolCall,
)
from .network.names import NetworkValidationError
from .protocols import SandboxScheduler, SandboxSession
from .run_request import RunOptions, RunRequest
from .scheduler import Scheduler
from .session import Session

__all__ = [
    "CodeValidationError",
    "CommunicationError",
    "CommunicationOutcomeUnknownError",
    "EnvVarValidationError",
    "ExecutionResult",
    "ExposedPort",
    "FileInfo",
    "NetworkConnection",
    "NetworkValidationError",
    "GuestAgentError",
    "InputValidationError",
    "Output",
    "OutputLimitError",
    "PackageBuildError",
    "PackageNotAllowedError",
    "PackagesReport",
    "PermanentError",
    "PortMapping",
    "RunOptions",
    "RunRequest",
    "SandboxError",
    "SandboxScheduler",
    "SandboxSession",
    "Scheduler",
    "SchedulerConfig",
    "Session",
    "SessionClosedError",
    "SessionSnapshot",
    "SnapshotError",
    "TimingBreakdown",
    "ToolCall",
    "TransientError",
    "VmCapacityError",
    "VmConfigError",
    "VmPermanentError",
    "VmTimeoutError",
    "VmTransientError",
]
__version__ = "0.1.0"
