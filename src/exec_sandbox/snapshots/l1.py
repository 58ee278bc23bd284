"""L1 memory snapshots: start a VM by cloning a booted, warmed-up template instead of booting.

A template is made once per configuration by a VM whose RAM lives in a shared file: after the
guest agent is READY and the language has been warmed up, QMP stops it and migrates its device
state (x-ignore-shared: the RAM file already is the memory) into `state`. A clone maps that
RAM file privately (copy-on-write: idle clones share the template's pages), loads `state` with
`-incoming defer` + `migrate-incoming`, resumes, and gets its RNG reseeded before it runs code.

Both migrations go through an fd passed over QMP (`getfd` + `fd:NAME`), not `exec:`: QEMU
spawns no shell, so it works under `-sandbox on,spawn=deny`.

Under the host jail QEMU sees a read-only mount tree and may not grow files (RLIMIT_FSIZE 0), so
it never opens a snapshot file by path: the host opens the RAM file and hands it over as fd 6
(`mem-path=/proc/self/fd/6`), saves the state through a pipe it copies to `state` itself, and
gives clones the RAM not as the cache file but as a sealed memfd copy of it (`RamFiles`): a clone
QEMU can map it privately (copy-on-write) but can never write to it, so a compromised clone
cannot change the template every other clone reads (docs/security.md).

Cache layout, one directory per key under `memory_snapshot_cache_dir`:
    <key>/ram         the template's RAM (sparse; never rewritten once published)
    <key>/state       QEMU's device state stream
    <key>/meta.json   the key's inputs, the state's SHA-256, the RAM size and the RAM digest
A directory is built under a temporary name (`.build-<key>-*`, flock()ed while its builder
lives) and published by rename, so readers see complete snapshots only. An invalid one (missing
file, other size, other hash, unreadable meta) is moved aside (`.trash-*`) and deleted: clones
never map the cache file (they map a sealed copy), and the next request cold-boots and rebuilds.

The RAM file is too large to hash on every lookup (only its size is checked there). Its digest
(`ram_digest`: SHA-256 over each data range's offset, length and bytes, holes skipped) is
computed at build time on the sealed copy clones of this process then map (`RamFiles.seal`),
and checked by `RamFiles.fd_for` on each sealed copy it makes of a published file, right after
sealing it: what is verified is what clones map, and nothing can change it afterwards. A
mismatch raises `SnapshotIntegrityError`.

The cache is bounded: after each publish, only the `KEEP_SNAPSHOTS` most recently used key
directories stay ("used": the directory's mtime, set at publish and refreshed when a scheduler
first copies its RAM for clones), and `.build-*`/`.trash-*` leftovers of killed processes older
than an hour go (never one whose builder still holds its lock). Only names this module makes are
ever removed.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from . import node_startup
from ..vm.execution import ExecRequest
from ..vm.guest import GuestVm
from ..vm.migration import save_devices
from .node_startup import NodeStartupCache
from ..vm.spec import VmSpec
from ..models import Language

log = logging.getLogger("exec_sandbox")
_T = TypeVar("_T")

# Bump when the layout or the way templates are made changes: old snapshots then miss.
# 2: meta.json carries the RAM digest. 3: TCG guests run without ERMS and boot with the APIC timer
# rate given (the C side's fixed QEMU options and command line are not in the key otherwise).
SNAPSHOT_FORMAT = 3
# Snapshot directories kept after a publish, most recently used first: every kernel, root image
# or QEMU change makes a new key, whose predecessors would otherwise stay on disk forever
# (~40 MB each). Eight covers three languages at a couple of memory sizes.
KEEP_SNAPSHOTS = 8
# A `.build-*` or `.trash-*` entry this old was left by a killed process (a build takes seconds).
LEFTOVER_AGE_SECONDS = 3600
_KEY_NAME = re.compile(r"[a-z]+-[0-9]+m-[0-9a-f]{24}")
_LEFTOVER_NAME = re.compile(r"\.(build-[a-z]+-[0-9]+m-[0-9a-f]{24}|trash)-[A-Za-z0-9_]+")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_TSC_KHZ = re.compile(r"\btsc_early_khz=([0-9]{1,12})\b")
# A device-state stream of these VMs is ~50 KB; anything far larger is not ours.
_STATE_MAX_BYTES = 64 * 1024 * 1024
_META_MAX_BYTES = 64 * 1024
# Languages whose template holds a pre-started interpreter (PRESTART), parked before the RNG
# reseed and the save: a restored clone then serves its first run without starting one (the L1
# path costs a restore, not an interpreter start). Only where no two clones' programs can see one
# generator state (docs/security.md, "Randomness in clones"): python seeds nothing a program sees
# before its code runs (`random` is imported on first use, after the clone's RESEED; os.urandom
# and secrets ask the kernel); node reseeds OpenSSL, V8's isolate generator and Math.random at
# its go in each clone (guest/node/node_reseed.c), and a node that cannot is killed by the RESEED
# instead (the template then holds none: slower, not wrong). Not bash: $RANDOM, which it cannot
# reseed. What clones of one template share: the string hash seeds, the address-space layout.
TEMPLATE_PRESTART_LANGUAGES: frozenset[Language] = frozenset({"python", "javascript"})
# Off only to measure what parking node saves (bench/speed_tiers.py: before and after in one run).
NODE_PARKED_IN_TEMPLATES = True


def template_holds_interpreter(language: Language) -> bool:
    """Whether a template of `language` is built with a parked interpreter (read at each use, so
    that the bench's switch applies to the keys and builds of the moment)."""
    if language == "javascript" and not NODE_PARKED_IN_TEMPLATES:
        return False
    return language in TEMPLATE_PRESTART_LANGUAGES

# What a javascript template does instead (docs/design.md, "JavaScript start-up"): it builds node's
# startup snapshot (its bootstrap, compiled and run once, no RNG state: each process still seeds
# its own) with the VM's own node, where the agent finds it for every later node start
# (guest/src/agent.h, SBX_NODE_SNAPSHOT): a clone's node then starts in about half the time. Built
# in the VM because V8 loads a blob only on the CPU feature set it was made on. Run as the sandbox
# user before any user code; a failure leaves a template without it (slower, not wrong).
NODE_SNAPSHOT_PATH = "/tmp/.sbx-node-startup.blob"
# Off only to measure what it saves (docs/benchmarks.md, "JavaScript start-up": set it by hand).
NODE_SNAPSHOT_IN_TEMPLATES = True
# The entry script: nothing of its own in the heap, but node 18 deserialises the global console
# with its legacy `Console` property undefined (`new console.Console(...)` would throw); it is
# put back, the same constructor, before anything else runs. Checked in the guest: every builtin
# module's, the global object's, console's and process's own properties and their types are
# those of a node started without the blob.
_NODE_SNAPSHOT_ENTRY = (
    "const { Console } = console;\n"
    "require('v8').startupSnapshot.addDeserializeCallback(() => { console.Console = Console; });\n"
)
_NODE_SNAPSHOT_BUILD = f"""set -e
dir=$(mktemp -d /tmp/.sbx-node-snapshot.XXXXXX)
cat >"$dir/entry.js" <<'EOF'
{_NODE_SNAPSHOT_ENTRY}EOF
node --snapshot-blob "$dir/blob" --build-snapshot "$dir/entry.js"
test "$(node --snapshot-blob "$dir/blob" -p 'typeof console.Console')" = function
mv -f "$dir/blob" {NODE_SNAPSHOT_PATH}
rm -rf "$dir"
""".encode()
_NODE_SNAPSHOT_TIMEOUT_MS = 120_000


async def _give_node_snapshot(vm: GuestVm, spec: VmSpec,
                              node_cache: NodeStartupCache | None) -> None:  # fmt: skip
    """The template's node startup snapshot: the host's copy of this machine's when the VM takes
    it in, else one built in the VM now, which the host keeps for other VMs when the template has
    no package layer (node_startup.py: nothing but the image's code ran in it)."""
    key = node_startup.blob_key(machine_identity(spec))
    if node_cache is not None and await node_cache.give(vm, key):
        return
    if not await _build_node_snapshot(vm) or node_cache is None or spec.layer is not None:
        return
    blob = await node_startup.read_out(vm)
    if blob is not None:
        await node_cache.store(key, blob)


async def _build_node_snapshot(vm: GuestVm) -> bool:
    outcome = await vm.execute(
        ExecRequest(
            language="raw",
            code=_NODE_SNAPSHOT_BUILD,
            timeout_ms=_NODE_SNAPSHOT_TIMEOUT_MS,
            env=[],
            stdout_limit=4096,
            stderr_limit=4096,
        )
    )
    if outcome.exit_code != 0:
        log.warning("javascript template without node's startup snapshot (exit %s): %s",
                    outcome.exit_code, outcome.stderr[-300:])  # fmt: skip
        return False
    return True


@functools.cache
def qemu_version(qemu_binary: str) -> str:
    """`qemu --version`'s first line: a QEMU upgrade makes every snapshot stale."""
    out = subprocess.run([qemu_binary, "--version"], capture_output=True, text=True, timeout=30,
                         check=False)  # fmt: skip
    return (out.stdout.strip().splitlines() or ["unknown"])[0]


def snapshot_key(spec: VmSpec, language: Language) -> str:
    """Everything that changes what a restored VM would be: images, QEMU, accelerator, RAM,
    vCPUs, kernel command line, language (the warmed-up interpreter), the package layer, the
    format."""
    inputs = {
        "format": SNAPSHOT_FORMAT,
        **machine_identity(spec),
        "language": language,
        "template_prestart": template_holds_interpreter(language),
        "node_snapshot": language == "javascript" and NODE_SNAPSHOT_IN_TEMPLATES,
        # A second disk changes the device layout, and its files are in the guest's page cache.
        "layer": None if spec.layer is None else spec.layer.identity,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{language}-{spec.memory_mb}m-{digest[:24]}"


def machine_identity(spec: VmSpec) -> dict[str, object]:
    """What a saved VM state can only be loaded into the same of: images, QEMU, accelerator,
    RAM size, vCPUs, kernel command line (part of L1 keys and of paused sessions' metadata)."""
    return {
        "kernel": spec.images.kernel_hash,
        "rootfs": spec.images.rootfs_hash,
        "qemu": qemu_version(spec.qemu_binary),
        "accel": spec.accel,
        "memory_mb": spec.memory_mb,
        "vcpus": spec.vcpus,
        "cmdline": _stable_cmdline(spec.kernel_cmdline_extra),
        # The network port changes the device layout (kept out of plain VMs' keys: unchanged).
        **({"net_port": True} if spec.net_port else {}),
    }


class SnapshotIntegrityError(Exception):
    """A snapshot's RAM is not what was saved: the sealed copy made for clones does not match
    the digest recorded at build time (the file was damaged or changed since)."""


def _stable_cmdline(cmdline: str) -> str:
    """The command line as far as it makes restored VMs differ. The host TSC frequency is
    measured by each process and its last digit jitters (2596139 vs 2596140 kHz here), which
    would give another key (a snapshot miss, and one more directory) to every other process:
    the key has it in MHz. A template booted with the other reading is as good: the difference
    is under a ppm, and a clone's clock is set at RESEED anyway."""
    return _TSC_KHZ.sub(lambda m: f"tsc_early_mhz={round(int(m.group(1)) / 1000)}", cmdline)


@dataclass(frozen=True)
class Snapshot:
    key: str
    ram: Path
    state: Path
    ram_digest: str  # from meta.json; RamFiles.fd_for checks the RAM against it


class SnapshotCache:
    def __init__(self, root: Path, node_cache: NodeStartupCache | None = None) -> None:
        self.root = root
        self.node_cache = node_cache  # where javascript templates keep node's startup snapshot
        self.ram_files = RamFiles()
        self._corrupt: set[str] = set()

    def close(self) -> None:
        self.ram_files.close()

    def lookup(self, key: str, memory_mb: int) -> Snapshot | None:
        """The published snapshot for key if it is complete and intact, else None (an invalid
        one is logged and removed)."""
        directory = self.root / key
        if not directory.is_dir():
            return None
        try:
            digest = _check(directory, key, memory_mb)
        except _Unusable as problem:
            log.warning("memory snapshot %s is unusable (%s): removing it; cold boot instead",
                        directory, problem)  # fmt: skip
            self.invalidate(key)
            return None
        return Snapshot(key, directory / "ram", directory / "state", digest)

    def invalidate(self, key: str) -> None:
        _remove_published(self.root, key)

    def discard_corrupt(self, key: str) -> bool:
        """Remove key's snapshot after its RAM failed its digest. True the first time for key in
        this cache object (rebuild it), False after that: a rebuild that is damaged again points
        at the disk or the host, and rebuilding in a loop would not help."""
        self.invalidate(key)
        first = key not in self._corrupt
        self._corrupt.add(key)
        return first

    def prune(self, keep: int = KEEP_SNAPSHOTS, *, protect: str | None = None) -> list[str]:
        """Remove all but the `keep` most recently used snapshot directories (never `protect`)
        and `.build-*`/`.trash-*` leftovers older than LEFTOVER_AGE_SECONDS whose builder is
        gone. Returns the names removed. Blocking (call it from an executor); never raises."""
        removed: list[str] = []
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return removed
        published: list[tuple[float, str]] = []
        now = time.time()
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if _KEY_NAME.fullmatch(entry.name):
                published.append((mtime, entry.name))
            elif _LEFTOVER_NAME.fullmatch(entry.name):
                if now - mtime > LEFTOVER_AGE_SECONDS and not _locked(Path(entry.path)):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.name)
        # Newest first, `protect` (the snapshot just published) before all.
        published.sort(key=lambda item: (item[1] != protect, -item[0]))
        for _mtime, name in published[keep:]:
            if _remove_published(self.root, name):
                removed.append(name)
        if removed:
            log.info("memory snapshot cache %s: removed %s", self.root, ", ".join(removed))
        return removed

    async def build(self, spec: VmSpec, language: Language, key: str, *, boot_timeout: float,
                    boot: Callable[..., Awaitable[GuestVm]]) -> Snapshot:  # fmt: skip
        """Boot a template VM of spec (with `boot`: the provisioning's VmFactory), warm
        `language` up, save it, publish it under key."""
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=self.root))
        # Held until the build ends: prune() never removes a build directory that is locked.
        lock_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        published = False
        try:
            # Opened and sized here: the jailed QEMU could neither open it by path (read-only
            # mounts) nor grow it (RLIMIT_FSIZE 0); it writes the RAM through its shared mapping.
            ram_fd = os.open(work / "ram", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(ram_fd, spec.memory_mb * 1024 * 1024)
                template_spec = replace(spec, mem_fd=ram_fd, mem_shared=True, qmp=True)
                vm = await boot(template_spec, boot_timeout=boot_timeout, on_boot_log=None)
            finally:
                os.close(ram_fd)  # QEMU has its own copy (fd 6)
            try:
                await vm.warm_up(language)
                if language == "javascript" and NODE_SNAPSHOT_IN_TEMPLATES:
                    await _give_node_snapshot(vm, spec, self.node_cache)
                if template_holds_interpreter(language):
                    await vm.prestart(language)
                # Reseed right before saving: the template's CRNG is then young, so the guest
                # kernel would not reseed it on its own for a while after a restore, and every
                # clone depends on the RESEED it gets (the security test relies on this to
                # notice a clone that was not reseeded). It also stamps the clock.
                await vm.reseed()
                await save_devices(vm, str(work / "state"))
            finally:
                # The RAM file must not change after the state was saved: QEMU is reaped
                # before anything reads it.
                await vm.aclose()
            state_hash = await _in_thread(functools.partial(_sha256, work / "state"))
            # Kept by ram_files: the first clone of it in this process maps that very copy.
            ram_hash = await _in_thread(functools.partial(self.ram_files.seal, key, work / "ram"))
            meta = {
                "format": SNAPSHOT_FORMAT,
                "key": key,
                "state_sha256": state_hash,
                "ram_bytes": spec.memory_mb * 1024 * 1024,
                "ram_digest": ram_hash,
            }
            (work / "meta.json").write_text(json.dumps(meta))
            try:
                os.rename(work, self.root / key)
                _touch(self.root / key)  # most recently used: the last one prune() removes
            except OSError:
                # Somebody else published this key first: theirs is as good as ours.
                shutil.rmtree(work, ignore_errors=True)
            published = True
        finally:
            os.close(lock_fd)
            if not published:
                shutil.rmtree(work, ignore_errors=True)
        await _in_thread(functools.partial(self.prune, protect=key))
        snapshot = self.lookup(key, spec.memory_mb)
        if snapshot is None:
            raise RuntimeError(f"memory snapshot {key} vanished after it was built")
        return snapshot


async def _in_thread(work: Callable[[], _T]) -> _T:
    """work() in the default executor. If the caller is cancelled meanwhile (Scheduler.close()
    cancels snapshot builds), this still waits for work to end before re-raising: a thread
    cannot be stopped, and the files and memfds it has open must be closed before close()
    returns (and before the build directory's removal is the last word on it)."""
    future = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait({future})
        if not future.cancelled():
            future.exception()  # retrieved: its outcome no longer matters
        raise


class _Unusable(Exception):
    """Why a published snapshot directory cannot be used (it is then removed)."""


def _check(directory: Path, key: str, memory_mb: int) -> str:
    """The RAM digest recorded for a complete, consistent snapshot directory; _Unusable if it
    is not one. The RAM itself is checked later, on the copy clones map (RamFiles.fd_for)."""
    try:
        with open(directory / "meta.json", "rb") as f:
            raw = f.read(_META_MAX_BYTES + 1)
        if len(raw) > _META_MAX_BYTES:
            raise _Unusable("meta.json too large")
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise _Unusable("meta.json is not an object")
        if meta.get("format") != SNAPSHOT_FORMAT or meta.get("key") != key:
            raise _Unusable("meta.json is for another format or key")
        ram_hash = meta.get("ram_digest")
        if not isinstance(ram_hash, str) or not _DIGEST.fullmatch(ram_hash):
            raise _Unusable("meta.json has no RAM digest")
        ram_size = (directory / "ram").stat().st_size
        if ram_size != memory_mb * 1024 * 1024 or meta.get("ram_bytes") != ram_size:
            raise _Unusable(f"RAM file has {ram_size} bytes")
        state = directory / "state"
        size = state.stat().st_size
        if size == 0 or size > _STATE_MAX_BYTES:
            raise _Unusable(f"state file has {size} bytes")
        if _sha256(state) != meta.get("state_sha256"):
            raise _Unusable("state file does not match its hash")
    except (OSError, ValueError) as exc:
        raise _Unusable(str(exc)) from None
    return ram_hash


def _remove_published(root: Path, name: str) -> bool:
    """Move root/name aside, then delete it (readers never see it half deleted). False if it
    was not there (another process may have removed it first)."""
    try:
        trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=root))
    except OSError:
        return False
    try:
        os.rename(root / name, trash / "old")
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _locked(directory: Path) -> bool:
    """Whether a builder holds directory's flock (then it is alive and its build in progress)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return True  # cannot tell: leave it alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops our lock
    return False


def _touch(directory: Path) -> None:
    """Mark a snapshot directory as used now (its mtime orders prune()); best effort."""
    try:
        os.utime(directory)
    except OSError:
        pass


class RamFiles:
    """Sealed memfd copies of snapshot RAM files, one per published file, for clones.

    A clone's QEMU (share=off) opens its RAM read-write (QEMU 7.2 has no read-only backing file
    with a writable private mapping). Given the cache file, a compromised clone could write to
    the template every later clone maps. A memfd sealed against writes, growth and shrinking
    can still be mapped privately and copy-on-write, but write(2) and shared writable mappings of
    it fail for everybody. Holes in the RAM file stay holes: only data ranges are copied.

    Each copy is checked against the snapshot's RAM digest once, right after it is sealed: the
    bytes verified are the bytes every clone of this object maps, and they cannot change. The
    copy a build makes to compute that digest (seal()) is kept, so the first clone of a snapshot
    built by this process neither copies nor hashes the file again."""

    def __init__(self) -> None:
        # (key, st_dev, st_ino, st_mtime_ns) of the RAM file -> its sealed copy. Renaming a
        # build directory into place changes none of these, so a copy made by seal() serves the
        # published file.
        self._fds: dict[tuple[str, int, int, int], int] = {}
        self._lock = threading.Lock()  # called from executor threads

    def seal(self, key: str, path: Path) -> str:
        """Make and keep the sealed copy of the RAM file a build of key has just saved (blocking:
        call it from an executor) and return its digest, which the build records."""
        with open(path, "rb", buffering=0) as f:
            fd, digest, ident = _seal(key, f.fileno())
        with self._lock:  # not held while copying: a foreground fd_for need not wait for that
            self._keep(ident, fd)
        return digest

    def fd_for(self, snapshot: Snapshot) -> int:
        """The sealed, verified memfd for this snapshot's RAM file (made on first use; blocking:
        call it from an executor). Valid until close(). SnapshotIntegrityError if the RAM does
        not match snapshot.ram_digest (nothing is kept then)."""
        with self._lock:
            with open(snapshot.ram, "rb", buffering=0) as f:
                fd = self._fds.get(_ident(snapshot.key, os.fstat(f.fileno())))
                if fd is not None:
                    return fd
                fd, digest, ident = _seal(snapshot.key, f.fileno())
            if digest != snapshot.ram_digest:
                os.close(fd)
                raise SnapshotIntegrityError(
                    f"RAM of memory snapshot {snapshot.key} does not match its digest"
                )
            self._keep(ident, fd)
            _touch(snapshot.ram.parent)  # used: once per scheduler and file
            return fd

    def _keep(self, ident: tuple[str, int, int, int], fd: int) -> None:
        for old in [k for k in self._fds if k[0] == ident[0]]:
            os.close(self._fds.pop(old))  # a rebuilt file: its old copy is unused now
        self._fds[ident] = fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _ident(key: str, st: os.stat_result) -> tuple[str, int, int, int]:
    return (key, st.st_dev, st.st_ino, st.st_mtime_ns)


def _seal(key: str, src: int) -> tuple[int, str, tuple[str, int, int, int]]:
    """A sealed copy of the RAM file open as src, its digest and its RamFiles identity."""
    st = os.fstat(src)
    fd = _sealed_copy(src, st.st_size)
    try:
        return fd, _memfd_digest(fd, st.st_size), _ident(key, st)
    except BaseException:
        os.close(fd)
        raise


def ram_digest(path: Path) -> str:
    """The digest RamFiles.fd_for checks, of a RAM file as it is now (what RamFiles.seal
    returns, without keeping the copy)."""
    with open(path, "rb", buffering=0) as f:
        fd, digest, _ident = _seal("", f.fileno())
    os.close(fd)
    return digest


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of each data range of fd below size, in order (SEEK_DATA / SEEK_HOLE)."""
    ranges = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        ranges.append((start, end))
        offset = end
    return ranges


def _sealed_copy(src: int, size: int) -> int:
    """A memfd with src's first size bytes, sealed against any change. Its holes are allocated
    (fallocate: zero pages the file still reports as holes, so the digest does not change)
    before it is sealed: a clone maps it privately, and a fault of a clone on a hole of a shmem
    file allocates a page in that file (on a read as well as before copying it on a write).
    Left sparse, every page a clone touched grew this copy for the scheduler's lifetime and was
    charged twice to the clone's cgroup (file page + its private copy): a guest using its RAM
    got QEMU OOM-killed by the host. Allocated up front, a clone's own memory is its private
    copies only, and this copy holds the guest's RAM size, once per snapshot file."""
    memfd = os.memfd_create("sbx-snapshot-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, size)
        for start, end in _data_ranges(src, size):
            os.lseek(memfd, start, os.SEEK_SET)  # sendfile writes at memfd's position
            while start < end:
                n = os.sendfile(memfd, src, start, min(end - start, 1 << 24))
                if n <= 0:
                    raise OSError(f"short copy of snapshot RAM at {start}")
                start += n
        os.posix_fallocate(memfd, 0, size)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)  # fmt: skip
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def _memfd_digest(fd: int, size: int) -> str:
    """SHA-256 over the size, then each data range's offset, length and bytes. Where the data
    lies is part of it: a hole that became data (or the reverse) changes the digest too."""
    h = hashlib.sha256(b"sbx-ram-digest-1")
    h.update(struct.pack("<Q", size))
    ranges = _data_ranges(fd, size)
    if not ranges:
        return h.hexdigest()
    # Hashed straight from a read-only mapping: no copy through a buffer (hashlib releases the
    # GIL for large inputs).
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mem:
        with memoryview(mem) as view:
            for start, end in ranges:
                h.update(struct.pack("<QQ", start, end - start))
                h.update(view[start:end])
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
