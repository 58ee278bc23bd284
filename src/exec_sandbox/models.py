"""Result and value types returned to users."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Language = Literal["python", "javascript", "raw"]
LANGUAGES: tuple[Language, ...] = ("python", "javascript", "raw")
# What callers may pass as `language`: the three runtimes and TypeScript's two names. TypeScript
# runs in the javascript runtime (its types are stripped in the guest when the code is not
# JavaScript: guest/runtime/node/ts_hook.js), so "typescript" and "ts" become "javascript" when
# validated, and a session, a result or a snapshot reports "javascript".
LanguageName = Literal["python", "javascript", "typescript", "ts", "raw"]
LANGUAGE_ALIASES: dict[str, Language] = {"typescript": "javascript", "ts": "javascript"}
LANGUAGE_NAMES: tuple[LanguageName, ...] = ("python", "javascript", "typescript", "ts", "raw")


@dataclass(frozen=True)
class TimingBreakdown:
    """Where the time of one call went, in milliseconds.

    setup_ms: everything before the VM starts (validation, admission, taking a pooled VM);
    boot_ms: cold boot, QEMU start until the guest agent said READY (0 when not booted);
    execute_ms: code dispatch until its exit; total_ms: the whole call.
    admission_ms: waiting for capacity (part of setup_ms);
    restore_ms: starting a clone of an L1 memory snapshot until the guest runs (0 when not
    restored); connect_ms: the first round trip with the guest before the code is sent (a
    restored guest's RNG reseed, a pooled VM's health check); packages_ms: getting the package
    layer (part of setup_ms; a cache hit costs a lookup, a miss the build of
    `ExecutionResult.packages.build_ms`).
    """

    setup_ms: int
    boot_ms: int
    execute_ms: int
    total_ms: int
    admission_ms: int = 0
    restore_ms: int = 0
    connect_ms: int = 0
    packages_ms: int = 0


@dataclass(frozen=True)
class PackagesReport:
    """The packages a VM had, and what getting them cost the call.

    packages: the installed set, resolved ("numpy==2.1.3", "lodash@4.17.21"), dependencies
    included; cache_hit: the layer was in the cache (nothing resolved, downloaded or built in
    this call); resolved: the resolver ran in this call (False when the request had been seen:
    its lock came from the cache); build_ms: the phases this call ran, in milliseconds (resolve,
    download, unpack, compile, image; empty on a cache hit); size_bytes: the layer image.
    """

    packages: tuple[str, ...]
    cache_hit: bool
    resolved: bool
    build_ms: dict[str, int] = field(default_factory=dict)
    size_bytes: int = 0


@dataclass(frozen=True)
class SessionSnapshot:
    """A paused session on disk (`Session.pause()`); `str()` of it is its id, which
    `Scheduler.resume()` takes, also in another process."""

    id: str
    language: Language
    memory_mb: int
    created_at: float  # time.time() of the pause
    size_bytes: int
    exec_count: int
    packages: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True)
class Template:
    """A built template: a whole environment (an image's tree plus the build's steps) that
    run()/session(template=name) start from.

    digest: "sha256:..." of its disk image (a rebuild under the same name gets a new one when
    anything changed); size_bytes: that image's size; languages: the interpreters it has and
    their versions ({"python": "3.12.1", "javascript": "v20.1.0", "raw": "bash"}); env and
    workdir: the environment and working directory of the code run in it; memory_mb, vcpus:
    what a call that gives none gets (None: the scheduler's defaults); source: what it was built
    from (an image reference or path, "default", or "template:<name>", then " + N steps"
    when it had steps); created_at: time.time() of the build; build_ms: how long the build took
    (0 when it was a cache hit)."""

    name: str
    digest: str
    size_bytes: int
    languages: dict[str, str]
    env: dict[str, str]
    workdir: str
    memory_mb: int | None = None
    vcpus: int | None = None
    source: str = ""
    created_at: float = 0.0
    build_ms: int = 0


@dataclass(frozen=True)
class PortMapping:
    """A guest port exposed on a host port (None: chosen by the host). TCP only."""

    internal: int
    external: int | None = None
    protocol: str = "tcp"


@dataclass(frozen=True)
class ExposedPort:
    """A guest port reachable from the host at host:external (bound to 127.0.0.1 only)."""

    internal: int
    external: int
    host: str = "127.0.0.1"
    protocol: str = "tcp"

    @property
    def url(self) -> str:
        """http://host:external, for a web server in the guest."""
        return f"http://{self.host}:{self.external}"


@dataclass(frozen=True)
class HttpRequestRecord:
    """One HTTP request the host read from a connection to a secret's host (or one with
    http_headers), re-sent by the host itself: method, path, the response status (0: none came),
    body bytes each way, the NAMES of the secrets put in (never values), and what went wrong
    ("" for nothing)."""

    method: str
    path: str
    status: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    secrets: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class NetworkConnection:
    """One connection attempt.

    direction: "outbound" (guest code connected to name:port) or "inbound" (a host client of an
    exposed port; name is "127.0.0.1", port the guest port); allowed: the host let it through
    (and, outbound, connected); reason: why it was refused or failed ("" otherwise);
    addresses: what the host resolved the name to (outbound); bytes_sent: guest -> peer;
    (both byte counts are known once the stream has ended: see still_open);
    bytes_received: peer -> guest; duration_ms: from the request to the end of the stream (or
    the refusal); started_at: time.time() of the request.

    reported_by_guest: the guest refused the attempt itself and reported it (a name outside
    allowed_domains its DNS stub answered NXDOMAIN: port 0; a connection on 80 or 443 to an IPv4
    address no allowed name was given, an IP literal or an unassigned synthetic address, which it
    reset: the address as name). Nothing reached the host; the entry is the guest's word, which
    a compromised guest may leave out or make up, bounded in number and rate (docs/security.md).
    Such reports left out by a rate limit are one entry with name "" and the count in its
    reason.

    http_requests: for a connection to a secret's host (docs/design.md, "Secrets"), the
    requests the host parsed and re-sent (HttpRequestRecord)."""

    direction: Literal["outbound", "inbound"]
    name: str
    port: int
    allowed: bool
    reason: str = ""
    addresses: tuple[str, ...] = ()
    bytes_sent: int = 0
    bytes_received: int = 0
    duration_ms: int = 0
    started_at: float = 0.0
    still_open: bool = False  # the stream was still open when the log was read (bytes: 0 so far)
    reported_by_guest: bool = False
    # The HTTP requests of a connection the host intercepted (to a secret's host), oldest first;
    # empty for the plain byte relay.
    http_requests: tuple[HttpRequestRecord, ...] = ()


@dataclass(frozen=True)
class FileInfo:
    """One entry of Session.list_files()."""

    name: str
    is_dir: bool
    size: int


@dataclass(frozen=True)
class Output:
    """One rich output of an execution in one MIME type: a matplotlib figure (image/png), an
    object given to display(), the value of a python cell's last expression. An object shown
    in several types (a DataFrame: text/html and text/plain) gives one Output per type, in
    the order the code made them. Text types (text/*, JSON, XML, SVG) are str, others bytes."""

    mime_type: str
    data: bytes | str


@dataclass(frozen=True)
class ToolCall:
    """One call the code made to a host tool (`tools={"name": fn}`): the arguments as the code
    sent them (JSON text), whether it succeeded, the error the code got otherwise."""

    name: str
    arguments: str
    ok: bool
    error: str | None
    duration_ms: int


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of running code once.

    exit_code: 0 success, n the program's status, 128+N killed by signal N, -1 timeout.
    """

    stdout: str
    stderr: str
    exit_code: int
    execution_time_ms: int | None = None
    external_cpu_time_ms: int | None = None
    external_memory_peak_mb: int | None = None
    timing: TimingBreakdown = field(default_factory=lambda: TimingBreakdown(0, 0, 0, 0))
    warm_pool_hit: bool = False
    l1_cache_hit: bool = False
    exposed_ports: list[ExposedPort] = field(default_factory=list)
    packages: PackagesReport | None = None  # None: the VM had no package layer
    # The network connections of the call (of this exec, for a session's): allowed and refused.
    network_log: list[NetworkConnection] = field(default_factory=list)
    # Figures, display()ed objects and the last expression's value, in the order they came.
    outputs: list[Output] = field(default_factory=list)
    # The host tools the code called, in the order the calls ended.
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def timed_out(self) -> bool:
        return self.exit_code == -1
