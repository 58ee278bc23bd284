"""The C extension's boundary: the only module that imports `_execsbx` (docs/architecture.md).

Everything else of the package reaches the C core through the names here: the protocol's
constants and limits, the QEMU process object (`start_qemu`, an `_execsbx.Vm`), and the host
facts the C core measures (TSC frequency, the seccomp policies, a jail probe for `sbx doctor`).

Who owns what around it, in this package: `process.py` starts and releases QEMU processes
without blocking the loop, `registry.py` is a scheduler's set of them, `guest.py` speaks to a
booted guest over the agent channel, and `migration.py` saves and loads a VM's state over QMP.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from .. import _execsbx
from ..models import Language
from .spec import VmSpec

LANGUAGE_CODES: dict[Language, int] = {
    "python": _execsbx.LANG_PYTHON,
    "javascript": _execsbx.LANG_JAVASCRIPT,
    "raw": _execsbx.LANG_RAW,
}
EXIT_TIMED_OUT = _execsbx.EXIT_TIMED_OUT
EXIT_STDOUT_LIMIT = _execsbx.EXIT_STDOUT_LIMIT
EXIT_STDERR_LIMIT = _execsbx.EXIT_STDERR_LIMIT
EXIT_REPL_RESET = _execsbx.EXIT_REPL_RESET
PROTOCOL_VERSION = int(_execsbx.PROTOCOL_VERSION)
RESEED_BYTES = int(_execsbx.RESEED_BYTES)
# What the wire protocol bounds (src/shared/protocol.h, which the guest agent is built with):
# limits.py takes the API's limits from here, so that the three sides cannot disagree.
PROTOCOL_LIMITS: dict[str, int] = {
    name: int(getattr(_execsbx, name))
    for name in (
        "CODE_MAX",
        "STDOUT_LIMIT_DEFAULT",
        "STDERR_LIMIT_DEFAULT",
        "ENV_MAX_COUNT",
        "ENV_NAME_MAX",
        "ENV_VALUE_MAX",
        "TIMEOUT_MS_MIN",
        "TIMEOUT_MS_MAX",
        "TIMEOUT_NONE",
        # Host tools and rich outputs (docs/protocol.md, "Host tools and rich outputs").
        "TOOL_NAME_MAX",
        "TOOL_ARGS_MAX",
        "TOOL_RESULT_MAX",
        "TOOL_CALLS_MAX",
        "TOOL_OK",
        "TOOL_ERROR",
        "OUTPUT_BEGIN",
        "OUTPUT_END",
        "OUTPUT_ITEM_MAX",
        "OUTPUTS_MAX",
        "OUTPUT_BYTES_MAX",
    )
}
# The guest broke the protocol (raised by the C decoder): the VM is not to be trusted any more.
ProtocolError = _execsbx.ProtocolError

# The file-transfer protocol (file_transfer.py speaks it through GuestVm.send_file_frame, the C core
# encodes it): limits, the requests, the mode flag and FILE_ERROR kinds, as the C core defines
# them.
FILE_SIZE_MAX = int(_execsbx.FILE_SIZE_MAX)
PATH_MAX = int(_execsbx.PATH_MAX)
PATH_COMPONENT_MAX = int(_execsbx.PATH_COMPONENT_MAX)
FileRequest = Literal["write_begin", "write_data", "write_end", "read", "list"]
# FILE_WRITE_BEGIN/FILE_READ flags: mode 0755; node's startup snapshot
# (snapshots/node_startup.py) in place
# of a path, its content led by NODE_TAG_SIZE bytes of the guest's CPU tag.
FILE_EXECUTABLE = int(_execsbx.FILE_EXECUTABLE)
FILE_NODE_SNAPSHOT = int(_execsbx.FILE_NODE_SNAPSHOT)
NODE_TAG_SIZE = int(_execsbx.NODE_TAG_SIZE)
FileEntry = _execsbx.FileEntry  # name, is_dir, size: one entry of a listing
# The guest's events, typed by the C decoder (struct sequences read by attribute; `Event` is their
# union, tagged by `kind`, for the type checker only).
from .._execsbx import FileEntriesEvent as FileEntriesEvent  # noqa: E402
from .._execsbx import OutputEvent as OutputEvent  # noqa: E402 - stdout, stderr, file_data

if TYPE_CHECKING:
    from .._execsbx import Event as Event
FILE_ERR_PATH = int(_execsbx.FILE_ERR_PATH)
FILE_ERR_NOT_FOUND = int(_execsbx.FILE_ERR_NOT_FOUND)
FILE_ERR_TOO_LARGE = int(_execsbx.FILE_ERR_TOO_LARGE)
FILE_ERR_PROTOCOL = int(_execsbx.FILE_ERR_PROTOCOL)
FILE_ERR_REFUSED = int(_execsbx.FILE_ERR_REFUSED)

# Background processes and terminals (protocol.h, "Processes"; processes.py speaks them through
# GuestVm.proc_request): limits, flags and error codes, as the C core defines them.
PROC: dict[str, int] = {
    name: int(getattr(_execsbx, name))
    for name in dir(_execsbx)
    if name.startswith(("PROC_", "MSG_PROC_"))
    or name in ("SPAWN_PTY", "ERR_NO_PROCESS", "ERR_LIMIT", "ERR_SPAWN", "OUTPUT_CHUNK_MAX")
}
from .._execsbx import ProcDataEvent as ProcDataEvent  # noqa: E402
from .._execsbx import ProcessEntry as ProcessEntry  # noqa: E402
from .._execsbx import ProcInfoEvent as ProcInfoEvent  # noqa: E402

# The network relay (network/hub.py): one NetRing per scheduler; NET_CONFIG goes on the agent
# channel like a file frame (GuestVm.send_net_config). NetRing.run() gives typed events (struct
# sequences, told apart with isinstance; `NetEvent` is their union, for the type checker only).
NetRing = _execsbx.NetRing
from .._execsbx import NetClosedEvent as NetClosedEvent  # noqa: E402
from .._execsbx import NetConnectedEvent as NetConnectedEvent  # noqa: E402
from .._execsbx import NetGuestRefusedEvent as NetGuestRefusedEvent  # noqa: E402
from .._execsbx import NetOpenEvent as NetOpenEvent  # noqa: E402
from .._execsbx import NetRefusedEvent as NetRefusedEvent  # noqa: E402
from .._execsbx import NetRelayEndEvent as NetRelayEndEvent  # noqa: E402

if TYPE_CHECKING:
    from .._execsbx import NetEvent as NetEvent
# NET_CONFIG's limits (src/shared/net_protocol.h): network/ checks the caller's values against them.
NET_NAME_MAX = int(_execsbx.NET_NAME_MAX)
NET_NAMES_MAX = int(_execsbx.NET_NAMES_MAX)
NET_EXTRA_PORTS_MAX = int(_execsbx.NET_EXTRA_PORTS_MAX)
NET_CA_BUNDLE_MAX = int(_execsbx.NET_CA_BUNDLE_MAX)
# Disks a VM may have besides the root (VmSpec.disks()): one fd each under the jail.
DISKS_MAX = int(_execsbx.DISKS_MAX)


def start_qemu(spec: VmSpec, *, incoming: bool) -> Any:
    """Fork QEMU for spec (returns right after the fork: process.spawn awaits its exec).
    Raises OSError (FileNotFoundError: no such binary) when the fork or its setup fails."""
    return _execsbx.Vm(
        qemu_binary=spec.qemu_binary,
        kernel=str(spec.images.kernel),
        rootfs=str(spec.images.rootfs),
        memory_mb=spec.memory_mb,
        vcpus=spec.vcpus,
        accel=spec.accel,
        kernel_cmdline_extra=spec.kernel_cmdline_extra,
        qmp=spec.qmp or incoming,
        mem_path=spec.mem_path,
        mem_fd=-1 if spec.mem_fd is None else spec.mem_fd,
        mem_shared=spec.mem_shared,
        incoming=incoming,
        qemu_sandbox=spec.qemu_sandbox,
        jail=spec.jail,
        disks=[
            (str(d.path), d.kind, d.writable, d.qcow2, d.backing, d.max_bytes) for d in spec.disks()
        ],
        net_port=spec.net_port,
    )


def measure_tsc_khz() -> int:
    return int(_execsbx.tsc_khz())


def seccomp_rules(policy: str = "allow") -> list[tuple[str, str, str]]:
    """The host seccomp policy as (syscall, action, reason), as the C core builds it: the
    allow-list ("allow", the default) or the deny-list ("deny", the fallback)."""
    return list(_execsbx.seccomp_rules(policy))


def probe_jail(
    stand_in: str, jail: dict[str, int], wait_seconds: float = 5.0
) -> tuple[int | None, list[tuple[str, bool, str]]]:
    """Spawn `stand_in` (e.g. /bin/true) under `jail` exactly as QEMU would be spawned, for `sbx
    doctor`: returns its exit status (None: still running after `wait_seconds`, then killed) and
    each jail layer as (layer, active, detail). Blocks: not for the event loop."""
    # The images are opened by the host under the jail: /dev/null stands in for them.
    vm = _execsbx.Vm(
        qemu_binary=stand_in, kernel="/dev/null", rootfs="/dev/null", memory_mb=128, jail=jail
    )
    try:
        vm.wait_spawn()
        deadline = time.monotonic() + wait_seconds
        status = vm.poll_exit()
        while status is None and time.monotonic() < deadline:
            time.sleep(0.01)
            status = vm.poll_exit()
    finally:
        vm.close()
    return status, list(vm.jail_status())
