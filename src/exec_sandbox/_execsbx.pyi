# Type stub of the C extension (src/_execsbx/). Keep in step with py_module.c and py_vm.c.
from collections.abc import Sequence
from os import PathLike
from types import TracebackType
from typing import Any, Literal, TypeAlias, final

_Path: TypeAlias = str | bytes | PathLike[str]

PROTOCOL_VERSION: int
CHANNEL_PORT_NAME: str
LANG_PYTHON: int
LANG_JAVASCRIPT: int
LANG_RAW: int
EXIT_TIMED_OUT: int
EXIT_STDOUT_LIMIT: int
EXIT_STDERR_LIMIT: int
EXIT_REPL_RESET: int
ERR_BAD_REQUEST: int
ERR_BUSY: int
ERR_SPAWN: int
ERR_INTERNAL: int
CODE_MAX: int
HOST_FRAME_MAX: int
GUEST_FRAME_MAX: int
OUTPUT_CHUNK_MAX: int
ENV_MAX_COUNT: int
ENV_NAME_MAX: int
ENV_VALUE_MAX: int
ERROR_MESSAGE_MAX: int
STDOUT_LIMIT_DEFAULT: int
STDERR_LIMIT_DEFAULT: int
TIMEOUT_MS_MIN: int
TIMEOUT_MS_MAX: int
TIMEOUT_NONE: int
MSG_FILE_WRITE_BEGIN: int
MSG_FILE_WRITE_DATA: int
MSG_FILE_WRITE_END: int
MSG_FILE_READ: int
MSG_FILE_LIST: int
FILE_EXECUTABLE: int
FILE_NODE_SNAPSHOT: int
FILE_ERR_REFUSED: int
NODE_TAG_SIZE: int
FILE_ERR_PATH: int
FILE_ERR_NOT_FOUND: int
FILE_ERR_IO: int
FILE_ERR_TOO_LARGE: int
FILE_ERR_PROTOCOL: int
FILE_SIZE_MAX: int
FILE_CHUNK_MAX: int
PATH_MAX: int
PATH_COMPONENT_MAX: int
RESEED_BYTES: int
MSG_NET_CONFIG: int
NET_NAME_MAX: int
NET_NAMES_MAX: int
NET_EXTRA_PORTS_MAX: int
NET_CA_BUNDLE_MAX: int
MSG_TOOL_RESULT: int
TOOL_OK: int
TOOL_ERROR: int
TOOL_RESULT_MAX: int
OUTPUT_BEGIN: int
OUTPUT_END: int
TOOL_NAME_MAX: int
TOOL_ARGS_MAX: int
TOOL_CALLS_MAX: int
MIME_TYPE_MAX: int
OUTPUT_DATA_MAX: int
OUTPUT_ITEM_MAX: int
OUTPUTS_MAX: int
OUTPUT_BYTES_MAX: int
DISKS_MAX: int
ERR_NO_PROCESS: int
ERR_LIMIT: int
MSG_PROC_SPAWN: int
MSG_PROC_READ: int
MSG_PROC_WRITE: int
MSG_PROC_SIGNAL: int
MSG_PROC_WAIT: int
MSG_PROC_LIST: int
MSG_PROC_RESIZE: int
SPAWN_PTY: int
PROC_RUNNING: int
PROC_PTY: int
PROC_STDIN_OPEN: int
PROC_STDOUT: int
PROC_STDERR: int
PROC_DATA_EOF: int
PROC_CLOSE_STDIN: int
PROC_MAX: int
PROC_TRACKED_MAX: int
PROC_PENDING_MAX: int
PROC_ARGV_MAX: int
PROC_ARG_MAX: int
PROC_COMMAND_MAX: int
PROC_TTY_MAX: int
PROC_WAIT_MS_MAX: int
PROC_WRITE_MAX: int
PROC_BUFFER_MAX: int
PROC_BUFFERS_TOTAL_MAX: int

# read_events() values: struct sequences (attributes, and tuple positions), kind first.
@final
class ReadyEvent(tuple[str, int, int, str]):
    @property
    def kind(self) -> Literal["ready"]: ...
    @property
    def id(self) -> int: ...
    @property
    def protocol_version(self) -> int: ...
    @property
    def agent_version(self) -> str: ...

@final
class OutputEvent(tuple[str, int, bytes]):
    @property
    def kind(self) -> Literal["stdout", "stderr", "file_data"]: ...
    @property
    def id(self) -> int: ...
    @property
    def data(self) -> bytes: ...

@final
class ExitEvent(tuple[str, int, int, int, int]):
    @property
    def kind(self) -> Literal["exit"]: ...
    @property
    def id(self) -> int: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def duration_us(self) -> int: ...

@final
class ErrorEvent(tuple[str, int, int, str]):
    @property
    def kind(self) -> Literal["error", "file_error"]: ...
    @property
    def id(self) -> int: ...
    @property
    def code(self) -> int: ...
    @property
    def message(self) -> str: ...

@final
class AckEvent(tuple[str, int]):
    @property
    def kind(self) -> Literal["pong", "reseeded"]: ...
    @property
    def id(self) -> int: ...

@final
class FileDoneEvent(tuple[str, int, int]):
    @property
    def kind(self) -> Literal["file_done"]: ...
    @property
    def id(self) -> int: ...
    @property
    def total(self) -> int: ...

@final
class FileEntry(tuple[bytes, bool, int]):
    @property
    def name(self) -> bytes: ...
    @property
    def is_dir(self) -> bool: ...
    @property
    def size(self) -> int: ...

@final
class FileEntriesEvent(tuple[str, int, list[FileEntry]]):
    @property
    def kind(self) -> Literal["file_entries"]: ...
    @property
    def id(self) -> int: ...
    @property
    def entries(self) -> list[FileEntry]: ...

@final
class ToolCallEvent(tuple[str, int, int, str, bytes]):
    @property
    def kind(self) -> Literal["tool_call"]: ...
    @property
    def id(self) -> int: ...
    @property
    def call(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> bytes: ...

@final
class OutputChunkEvent(tuple[str, int, int, str, bytes]):
    @property
    def kind(self) -> Literal["output"]: ...
    @property
    def id(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def mime_type(self) -> str: ...
    @property
    def data(self) -> bytes: ...

@final
class ProcessEntry(tuple[int, int, int, int, int, str]):
    @property
    def pid(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def stdout_bytes(self) -> int: ...
    @property
    def stderr_bytes(self) -> int: ...
    @property
    def command(self) -> str: ...

@final
class ProcInfoEvent(tuple[str, int, list[ProcessEntry]]):
    @property
    def kind(self) -> Literal["proc_info"]: ...
    @property
    def id(self) -> int: ...
    @property
    def processes(self) -> list[ProcessEntry]: ...

@final
class ProcDataEvent(tuple[str, int, int, int, bytes]):
    @property
    def kind(self) -> Literal["proc_data"]: ...
    @property
    def id(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def data(self) -> bytes: ...

@final
class EofEvent(tuple[str]):
    @property
    def kind(self) -> Literal["eof"]: ...

Event: TypeAlias = (
    ReadyEvent
    | OutputEvent
    | ExitEvent
    | ErrorEvent
    | AckEvent
    | FileDoneEvent
    | FileEntriesEvent
    | ToolCallEvent
    | OutputChunkEvent
    | ProcInfoEvent
    | ProcDataEvent
    | EofEvent
)

class ProtocolError(OSError):
    events: list[Event]

def build_qemu_argv(
    *,
    qemu_binary: _Path,
    kernel: _Path,
    rootfs: _Path,
    memory_mb: int,
    vcpus: int,
    accel: str,
    kernel_cmdline_extra: str = ...,
    qmp: bool = ...,
    mem_path: _Path | None = ...,
    mem_shared: bool = ...,
    incoming: bool = ...,
    qemu_sandbox: bool = ...,
    mem_fd: int = ...,
    disks: Sequence[tuple[_Path, str, bool] | tuple[_Path, str, bool, bool, int, int]] | None = ...,
    net_port: bool = ...,
) -> list[str]: ...
def seccomp_rules(policy: str = "allow") -> list[tuple[str, str, str]]: ...
def tsc_khz() -> int: ...

class Vm:
    pid: int
    pidfd: int
    channel_fd: int
    console_fd: int
    qmp_fd: int
    net_fd: int
    spawn_fd: int
    closed: bool
    def __init__(
        self,
        *,
        qemu_binary: _Path,
        kernel: _Path,
        rootfs: _Path,
        memory_mb: int,
        vcpus: int = ...,
        accel: str = ...,
        kernel_cmdline_extra: str = ...,
        qmp: bool = ...,
        mem_path: _Path | None = ...,
        mem_shared: bool = ...,
        incoming: bool = ...,
        mem_fd: int = ...,
        jail: dict[str, int | bool] | None = ...,
        qemu_sandbox: bool = ...,
        disks: Sequence[tuple[_Path, str, bool] | tuple[_Path, str, bool, bool, int, int]]
        | None = ...,
        net_port: bool = ...,
    ) -> None: ...
    def check_spawn(self) -> bool: ...
    def wait_spawn(self) -> None: ...
    def jail_status(self) -> list[tuple[str, bool, str]]: ...
    def resource_usage(self) -> tuple[int | None, int | None] | None: ...
    def cgroup_dirs(self) -> list[str]: ...
    def read_events(self) -> list[Event]: ...
    def send_exec(
        self,
        id: int,
        language: int,
        timeout_ms: int,
        stdout_limit: int,
        stderr_limit: int,
        env: Sequence[tuple[bytes, bytes]],
        code: bytes,
        session: bool = ...,
    ) -> int: ...
    def send_ping(self, id: int) -> int: ...
    def send_reseed(self, id: int, seed: bytes, realtime_ns: int = ..., /) -> int: ...
    def send_file_write_begin(self, id: int, path: bytes, flags: int, /) -> int: ...
    def send_file_write_data(self, id: int, data: bytes | memoryview, /) -> int: ...
    def send_file_write_end(self, id: int, commit: bool, /) -> int: ...
    def send_file_read(self, id: int, path: bytes, flags: int = 0, /) -> int: ...
    def send_file_list(self, id: int, path: bytes, /) -> int: ...
    def send_net_config(
        self, id: int, outbound: bool, names: Sequence[str], ports: Sequence[int], ca_bundle: bytes
    ) -> int: ...
    def send_tool_result(
        self, id: int, call: int, status: int, body: bytes | memoryview, /
    ) -> int: ...
    def send_proc_spawn(
        self,
        id: int,
        argv: Sequence[bytes],
        cwd: bytes,
        env: Sequence[tuple[bytes, bytes]],
        pty: bool = False,
        cols: int = 0,
        rows: int = 0,
    ) -> int: ...
    def send_proc_read(
        self, id: int, pid: int, stream: int, offset: int, max_bytes: int, wait_ms: int, /
    ) -> int: ...
    def send_proc_write(
        self, id: int, pid: int, data: bytes | memoryview, close_stdin: bool = False
    ) -> int: ...
    def send_proc_signal(self, id: int, pid: int, signal: int, /) -> int: ...
    def send_proc_wait(self, id: int, pid: int, wait_ms: int, /) -> int: ...
    def send_proc_list(self, id: int, /) -> int: ...
    def send_proc_resize(self, id: int, pid: int, cols: int, rows: int, /) -> int: ...
    def flush(self) -> int: ...
    def read_console(self) -> bytes: ...
    def poll_exit(self) -> int | None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...
    def fileno(self) -> int: ...
    def __enter__(self) -> Vm: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

# NetRing.run() values: struct sequences like read_events()'s, kind and relay first.
@final
class NetOpenEvent(tuple[str, int, int, str, int]):
    @property
    def kind(self) -> Literal["open"]: ...
    @property
    def relay(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def port(self) -> int: ...

@final
class NetConnectedEvent(tuple[str, int, int, int]):
    @property
    def kind(self) -> Literal["connected"]: ...
    @property
    def relay(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def status(self) -> int: ...

@final
class NetClosedEvent(tuple[str, int, int, int, int, bool]):
    @property
    def kind(self) -> Literal["closed"]: ...
    @property
    def relay(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def bytes_to_guest(self) -> int: ...
    @property
    def bytes_from_guest(self) -> int: ...
    @property
    def reset(self) -> bool: ...

@final
class NetRefusedEvent(tuple[str, int, int, str, int, int]):
    @property
    def kind(self) -> Literal["refused"]: ...
    @property
    def relay(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def status(self) -> int: ...

@final
class NetGuestRefusedEvent(tuple[str, int, str, str, int, int]):
    @property
    def kind(self) -> Literal["guest_refused"]: ...
    @property
    def relay(self) -> int: ...
    @property
    def what(self) -> Literal["name", "address", "dropped"]: ...
    @property
    def subject(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def attempts(self) -> int: ...

@final
class NetRelayEndEvent(tuple[str, int, str]):
    @property
    def kind(self) -> Literal["violation", "port_closed"]: ...
    @property
    def relay(self) -> int: ...
    @property
    def reason(self) -> str: ...

NetEvent: TypeAlias = (
    NetOpenEvent
    | NetConnectedEvent
    | NetClosedEvent
    | NetRefusedEvent
    | NetGuestRefusedEvent
    | NetRelayEndEvent
)

class NetRing:
    """One io_uring relaying the network streams of many VMs (net_relay.h)."""

    closed: bool
    def __init__(self, *, entries: int = ...) -> None: ...
    def fileno(self) -> int: ...
    def run(self) -> list[NetEvent]: ...
    def add_relay(self, port_fd: int) -> int: ...
    def close_relay(self, relay: int) -> bool: ...
    def open_reply(
        self, relay: int, stream: int, status: int, reason: str = ..., sock: Any = ...
    ) -> bool: ...
    def connect(self, relay: int, guest_port: int, sock: Any) -> int: ...
    def ingest(self, relay: int, data: bytes) -> None: ...
    def live(self) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> NetRing: ...
    def __exit__(self, *args: object) -> None: ...
