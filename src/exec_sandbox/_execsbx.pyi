# Type stub of the C extension (src/_execsbx/). Keep in step with py_module.c and py_vm.c.
from collections.abc import Sequence
from os import PathLike
from types import TracebackType
from typing import Any, TypeAlias

_Path: TypeAlias = str | bytes | PathLike[str]

PROTOCOL_VERSION: int
CHANNEL_PORT_NAME: str
LANG_PYTHON: int
LANG_JAVASCRIPT: int
LANG_RAW: int
EXIT_TIMED_OUT: int
EXIT_STDOUT_LIMIT: int
EXIT_STDERR_LIMIT: int
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
MSG_FILE_WRITE_BEGIN: int
MSG_FILE_WRITE_DATA: int
MSG_FILE_WRITE_END: int
MSG_FILE_READ: int
MSG_FILE_LIST: int
FILE_EXECUTABLE: int
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

class ProtocolError(OSError):
    events: list[tuple[Any, ...]]

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
    layer: _Path | None = ...,
    layer_kind: str | None = ...,
    net_port: bool = ...,
) -> list[str]: ...
def seccomp_rules() -> list[tuple[str, str, str]]: ...
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
        layer: _Path | None = ...,
        layer_kind: str | None = ...,
        net_port: bool = ...,
    ) -> None: ...
    def check_spawn(self) -> bool: ...
    def wait_spawn(self) -> None: ...
    def jail_status(self) -> list[tuple[str, bool, str]]: ...
    def resource_usage(self) -> tuple[int | None, int | None] | None: ...
    def cgroup_dirs(self) -> list[str]: ...
    def read_events(self) -> list[tuple[Any, ...]]: ...
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
    def send_file_frame(self, type: int, id: int, payload: bytes | memoryview, /) -> int: ...
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
