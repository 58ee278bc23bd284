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
    <key>/disk        the template's work disk (read-only; the guest formatted and mounted it
                      before the save), when its VMs have one: each clone runs on a copy
    <key>/meta.json   the key's inputs, the state's SHA-256, the RAM size and the RAM digest
A directory is built under a temporary name (`.build-<key>-*`, flock()ed while its builder
lives) and published by rename, so readers see complete snapshots only. An invalid one (missing
file, other size, other hash, unreadable meta) is moved aside (`.trash-*`) and deleted: clones
never map the cache file (they map a sealed copy), and the next request cold-boots and rebuilds.

The RAM file is too large to hash on every lookup (only its size is checked there). Its digest
(`ram_digest`: SHA-256 over each non-zero 64 KiB block's offset and bytes, only data ranges
read: of the bytes, not of where the file keeps them, so a `cp -a` of a directory still passes) is
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

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .._threads import in_thread
from ..digest import file_sha256
from ..errors import SandboxError
from ..models import Language
from ..vm import workspace
from ..vm.guest import GuestVm
from ..vm.migration import save_devices
from ..vm.spec import VmSpec
from ..vm.workspace import WorkDisk
from . import node_startup
from .identity import machine_identity
from .node_startup import NodeStartupCache
from .ram import RamFiles, mark_used

log = logging.getLogger("exec_sandbox")

# Bump when the layout or the way templates are made changes: old snapshots then miss.
# 2: meta.json carries the RAM digest. 3: TCG guests run without ERMS and boot with the APIC timer
# rate given (the C side's fixed QEMU options and command line are not in the key otherwise).
# 4: the RAM digest is of the bytes, not of the file's layout (ram.py): a digest of format 3
# would not match, and its snapshot would be refused as damaged instead of missing.
# 5: VMs have a work disk, kept beside the RAM (its size is in the key, through the machine).
SNAPSHOT_FORMAT = 5
# Snapshot directories kept after a publish, most recently used first: every kernel, root image
# or QEMU change makes a new key, whose predecessors would otherwise stay on disk forever
# (~40 MB each). Eight covers three languages at a couple of memory sizes.
KEEP_SNAPSHOTS = 8
# A `.build-*` or `.trash-*` entry this old was left by a killed process (a build takes seconds).
LEFTOVER_AGE_SECONDS = 3600
_KEY_NAME = re.compile(r"[a-z]+-[0-9]+m-[0-9a-f]{24}")
_LEFTOVER_NAME = re.compile(r"\.(build-[a-z]+-[0-9]+m-[0-9a-f]{24}|trash)-[A-Za-z0-9_]+")
_DIGEST = re.compile(r"[0-9a-f]{64}")
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


def _gets_node_blob(spec: VmSpec, language: Language) -> bool:
    """Whether the snapshot VM's node starts from a startup blob: the blob is of the default
    image's node, a user template brings its own node, and a node with its own built-in
    startup snapshot gets none (node_startup.wanted)."""
    return (
        language == "javascript"
        and node_startup.BUILT_IN_TEMPLATES
        and spec.template is None
        and node_startup.wanted(spec)
    )


def snapshot_key(spec: VmSpec, language: Language) -> str:
    """Everything that changes what a restored VM would be: images, QEMU, accelerator, RAM,
    vCPUs, kernel command line, language (the warmed-up interpreter), the package layer, the
    format."""
    inputs = {
        "format": SNAPSHOT_FORMAT,
        **machine_identity(spec),
        "language": language,
        "template_prestart": template_holds_interpreter(language),
        "node_snapshot": _gets_node_blob(spec, language),
        # A second disk changes the device layout, and its files are in the guest's page cache.
        "layer": None if spec.layer is None else spec.layer.identity,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{language}-{spec.memory_mb}m-{digest[:24]}"


@dataclass(frozen=True)
class Snapshot:
    key: str
    ram: Path
    state: Path
    ram_digest: str  # from meta.json; RamFiles.fd_for checks the RAM against it
    disk: Path | None = None  # the work disk, when its VMs have one (size checked by lookup)


class SnapshotCache:
    def __init__(self, root: Path, node_cache: NodeStartupCache | None = None) -> None:
        self.root = root
        self.node_cache = node_cache  # where javascript templates keep node's startup snapshot
        self.ram_files = RamFiles()
        self._corrupt: set[str] = set()

    def close(self) -> None:
        self.ram_files.close()

    def ram_fd(self, snapshot: Snapshot) -> int:
        """The sealed, verified copy of snapshot's RAM that its clones map (RamFiles.fd_for;
        blocking: call it from an executor). SnapshotIntegrityError if it is damaged."""
        return self.ram_files.fd_for(snapshot.key, snapshot.ram, snapshot.ram_digest)

    async def disk_copy(self, snapshot: Snapshot, spec: VmSpec) -> WorkDisk | None:
        """A new copy of snapshot's work disk for one clone of it (None: spec has no disk).
        The snapshot's file is never written: every clone has its own copy."""
        if not spec.disk_mb:
            return None
        if snapshot.disk is None or spec.disk_dir is None:
            raise SandboxError(f"memory snapshot {snapshot.key} has no work disk")
        fd = await in_thread(
            functools.partial(workspace.open_file, snapshot.disk), discard=os.close
        )
        try:
            return await workspace.new(spec.disk_dir, spec.disk_mb, fd)
        finally:
            os.close(fd)

    def lookup(self, key: str, memory_mb: int) -> Snapshot | None:
        """The published snapshot for key if it is complete and intact, else None (an invalid
        one is logged and removed)."""
        directory = self.root / key
        if not directory.is_dir():
            return None
        try:
            digest = _check(directory, key, memory_mb)
        except _Unusable as problem:
            log.warning(
                "memory snapshot %s is unusable (%s): removing it; cold boot instead",
                directory,
                problem,
            )
            self.invalidate(key)
            return None
        disk = directory / "disk"
        return Snapshot(
            key, directory / "ram", directory / "state", digest, disk if disk.exists() else None
        )

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

    async def build(
        self,
        spec: VmSpec,
        language: Language,
        key: str,
        *,
        boot_timeout: float,
        boot: Callable[..., Awaitable[GuestVm]],
    ) -> Snapshot:
        """Boot a template VM of spec (with `boot`: the provisioning's VmFactory), warm
        `language` up, save it, publish it under key."""
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=self.root))
        # Held until the build ends: prune() never removes a build directory that is locked.
        lock_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        published = False
        disk_fd = -1
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
                if _gets_node_blob(spec, language):
                    await node_startup.give_template_blob(vm, spec, self.node_cache)
                if template_holds_interpreter(language):
                    await vm.prestart(language)
                # Reseed right before saving: the template's CRNG is then young, so the guest
                # kernel would not reseed it on its own for a while after a restore, and every
                # clone depends on the RESEED it gets (the security test relies on this to
                # notice a clone that was not reseeded). It also stamps the clock.
                await vm.reseed()
                await save_devices(vm, str(work / "state"))
                # The work disk as the saved state has it mounted: kept open past the VM's
                # close, named once QEMU is reaped (nothing writes it after that).
                if vm.spec.work is not None:
                    disk_fd = os.dup(vm.spec.work.fd)
            except SandboxError:
                # A template VM that dies leaves only its console to say why (a guest panic,
                # QEMU's own message): kept in the log beside the caller's warning.
                # Killed by its scheduler's close(): nothing went wrong, nothing to say.
                closing = vm.registry is not None and vm.registry.closed
                log.log(
                    logging.DEBUG if closing else logging.WARNING,
                    "the VM making memory snapshot %s failed%s",
                    key,
                    vm.console_hint(),
                )
                raise
            finally:
                # The RAM file must not change after the state was saved: QEMU is reaped
                # before anything reads it.
                await vm.aclose()
            if disk_fd >= 0:
                await in_thread(functools.partial(workspace.link, disk_fd, work / "disk"))
            state_hash = await in_thread(functools.partial(file_sha256, work / "state"))
            # Kept by ram_files: the first clone of it in this process maps that very copy.
            ram_hash = await in_thread(functools.partial(self.ram_files.seal, key, work / "ram"))
            meta = {
                "format": SNAPSHOT_FORMAT,
                "key": key,
                "state_sha256": state_hash,
                "ram_bytes": spec.memory_mb * 1024 * 1024,
                "ram_digest": ram_hash,
                "disk_bytes": spec.disk_mb << 20,
            }
            (work / "meta.json").write_text(json.dumps(meta))
            try:
                os.rename(work, self.root / key)
                mark_used(self.root / key)  # most recently used: the last one prune() removes
            except OSError:
                # Somebody else published this key first: theirs is as good as ours.
                shutil.rmtree(work, ignore_errors=True)
            published = True
        finally:
            os.close(lock_fd)
            if disk_fd >= 0:
                os.close(disk_fd)
            if not published:
                shutil.rmtree(work, ignore_errors=True)
        await in_thread(functools.partial(self.prune, protect=key))
        snapshot = self.lookup(key, spec.memory_mb)
        if snapshot is None:
            raise RuntimeError(f"memory snapshot {key} vanished after it was built")
        return snapshot


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
        if file_sha256(state) != meta.get("state_sha256"):
            raise _Unusable("state file does not match its hash")
        disk_bytes = meta.get("disk_bytes", 0)  # none: a VM without a work disk
        if not isinstance(disk_bytes, int):
            raise _Unusable("meta.json has no disk size")
        disk = directory / "disk"
        if disk_bytes and disk.stat().st_size != disk_bytes:
            raise _Unusable(f"disk file has {disk.stat().st_size} bytes")
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
