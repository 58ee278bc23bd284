"""Node's startup snapshot for cold-booted VMs (docs/design.md, "JavaScript start-up").

Only for images whose node lacks node's built-in startup snapshot (Debian's builds): official
builds, such as the image's node 22 from its pinned wheel, have one with a code cache and start
faster without a user-land blob, so none is built, kept or given for them (`wanted`, from the
image's facts). Without it, every node start compiles and runs node's whole bootstrap (~0.7 s of
a ~2 s start under TCG for Debian's node 18). A javascript template builds a
snapshot of it with the VM's own node before any user code runs (l1.py), and its clones
have it. This module keeps a copy of those bytes per machine on the host, so that a cold-booted
VM that runs JavaScript gets it too: it is written into the guest before the VM's first node
starts.

What the host handles is opaque: the guest reads the blob out with its CPU tag in front
(protocol.h, SBX_FILE_NODE_SNAPSHOT), and takes one in only when the tag is its own (V8 aborts on a
blob made for another CPU feature set). The host never parses either; it bounds the size and
keeps a SHA-256 with each copy, so that a damaged file is never written into a VM.

Where a blob may come from: only a template without a package layer, whose VM ran nothing but
the image's own code (no package's install scripts, no user code) before the blob was read out.
The blob holds node's bootstrap and no randomness: each node process still seeds V8's and
OpenSSL's generators itself (docs/security.md, "Randomness in clones").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Literal

from ..errors import SandboxError
from ..vm import binding, file_transfer
from ..vm.execution import ExecRequest
from ..vm.guest import GuestVm
from ..vm.spec import VmSpec
from .identity import machine_identity

log = logging.getLogger("exec_sandbox")

# Node 18's blob is ~2.4 MB; a guest that sends more than this is cut off (the VM is closed).
BLOB_MAX = 64 * 1024 * 1024
# Blobs of other machines (an upgraded QEMU, new images) are removed beyond this many.
KEEP_BLOBS = 2
# Off only to measure what it saves (bench/speed_tiers.py: cold boots before and after).
GIVE_TO_COLD_BOOTS = True
InstallOutcome = Literal["taken", "refused", "failed"]
_PREFIX = "node-startup-"
_SUFFIX = ".blob"
_DIGEST_SIZE = 32  # the SHA-256 in front of each kept blob


def blob_key(machine: Mapping[str, object]) -> str:
    """The cache key of a VM's blob, from its identity.machine_identity(): what decides whether
    a blob loads is the images (node's build), QEMU, accelerator, vCPUs and kernel command line
    (the CPU the guest sees), and the host's CPU (under KVM the guest's is the host's); not the
    RAM size nor the network port, so one blob serves every configuration of the machine. The
    guest checks its CPU tag on top of this."""
    identity = {k: v for k, v in machine.items() if k not in {"memory_mb", "net_port"}}
    identity["host_cpu"] = _host_cpu_flags()
    identity["format"] = 1
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


@cache
def _host_cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return "unknown"


class NodeStartupCache:
    """The host's copies of node's startup snapshot (tag and blob, as the guest sent them), one
    file per blob_key in root (the memory snapshot cache directory: its pruning leaves files
    alone). Each file starts with the SHA-256 of what follows, checked at every load: a torn or
    damaged file is dropped, never handed to a VM (the guest checks the tag, not the blob). A
    failure to keep a blob is logged, never raised: the blob only saves time."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{_PREFIX}{key}{_SUFFIX}"

    async def load(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._load, key)

    def _load(self, key: str) -> bytes | None:
        try:
            with self._path(key).open("rb") as source:
                stored = source.read(_DIGEST_SIZE + BLOB_MAX + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("node startup snapshot %s unreadable: %s", self._path(key), exc)
            return None
        digest, data = stored[:_DIGEST_SIZE], stored[_DIGEST_SIZE:]
        intact = hashlib.sha256(data).digest() == digest
        if not intact or not binding.NODE_TAG_SIZE < len(data) <= BLOB_MAX:
            log.warning("node startup snapshot %s is damaged: dropped", self._path(key))
            self._discard(key)
            return None
        return data

    async def store(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._store, key, data)

    def _store(self, key: str, data: bytes) -> None:
        partial = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # Its own name per writer (schedulers of one process may store the same key at
            # once), created 0600.
            fd, name = tempfile.mkstemp(
                dir=self.root, prefix=f".{_PREFIX}{key}.", suffix=".partial"
            )
            partial = Path(name)
            with os.fdopen(fd, "wb") as sink:
                sink.write(hashlib.sha256(data).digest())
                sink.write(data)
            partial.replace(self._path(key))
            partial = None
        except OSError as exc:
            log.warning("node startup snapshot not kept in %s: %s", self.root, exc)
            return
        finally:
            if partial is not None:
                partial.unlink(missing_ok=True)
        self._prune(protect=key)

    async def give(self, vm: GuestVm, key: str) -> bool:
        """Write key's blob into vm, if kept: True when the VM took it. One the VM refuses
        (another CPU's tag) is dropped; after any other failure it is kept (install())."""
        blob = await self.load(key)
        if blob is None:
            return False
        outcome = await install(vm, blob)
        if outcome == "refused":
            await self.discard(key)
        return outcome == "taken"

    async def discard(self, key: str) -> None:
        await asyncio.to_thread(self._discard, key)

    def _discard(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self._path(key).unlink()

    def _prune(self, protect: str) -> None:
        """Keep the KEEP_BLOBS most recently stored blobs (always protect, the one just stored;
        the others are of other machines: another QEMU, older images) and remove the partial
        files of writers that died more than an hour ago."""
        try:
            entries = list(self.root.iterdir())
        except OSError:
            return
        now = time.time()
        for partial in entries:
            if (
                partial.name.startswith(f".{_PREFIX}")
                and partial.name.endswith(".partial")
                and now - _mtime(partial) > 3600
            ):
                with contextlib.suppress(OSError):
                    partial.unlink()
        blobs = [p for p in entries if p.name.startswith(_PREFIX) and p.name.endswith(_SUFFIX)]
        blobs.sort(key=lambda p: (p != self._path(protect), -_mtime(p)))
        for stale in blobs[KEEP_BLOBS:]:
            with contextlib.suppress(OSError):
                stale.unlink()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


async def install(vm: GuestVm, blob: bytes) -> InstallOutcome:
    """Write blob (tag and snapshot, as read_out gave them) into vm, for its next node starts:
    "taken"; "refused" when the tag is not the guest's (drop the blob: it will never fit this
    machine's VMs); "failed" for any other reason the VM is still fine after (keep the blob). A VM
    broken on the way raises, as any other request to it would."""
    try:
        await file_transfer.write_target(vm, b"", blob, binding.FILE_NODE_SNAPSHOT)
    except file_transfer.ContentRefused as exc:
        log.warning("node startup snapshot refused by the VM: %s", exc)
        return "refused"
    except (SandboxError, OSError) as exc:
        if not vm.alive:
            raise
        log.warning("node startup snapshot not written into the VM: %s", exc)
        return "failed"
    return "taken"


async def read_out(vm: GuestVm) -> bytes | None:
    """The VM's node startup snapshot, led by its CPU tag; None when it has none."""
    try:
        data = await file_transfer.read_target(vm, b"", None, binding.FILE_NODE_SNAPSHOT, BLOB_MAX)
    except (SandboxError, OSError) as exc:
        log.warning("node startup snapshot not read out of the memory snapshot VM: %s", exc)
        return None
    return data if data is not None and len(data) > binding.NODE_TAG_SIZE else None


# What a javascript template does instead (docs/design.md, "JavaScript start-up"): it builds node's
# startup snapshot (its bootstrap, compiled and run once, no RNG state: each process still seeds
# its own) with the VM's own node, where the agent finds it for every later node start
# (guest/src/agent.h, SBX_NODE_SNAPSHOT): a clone's node then starts in about half the time. Built
# in the VM because V8 loads a blob only on the CPU feature set it was made on. Run as the sandbox
# user before any user code; a failure leaves a template without it (slower, not wrong).
NODE_SNAPSHOT_PATH = "/tmp/.sbx-node-startup.blob"
# Off only to measure what it saves (docs/benchmarks.md, "JavaScript start-up": set it by hand).
BUILT_IN_TEMPLATES = True
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


def wanted(spec: VmSpec) -> bool:
    """Whether VMs of spec's images get a user-land startup blob at all: not when the image's node
    was built with node's own startup snapshot and code cache (official builds, images/rootfs/
    pinned-wheels.txt), which start faster without one (measured: 22.20 44.7 -> 51.7 ms with a
    blob, docs/benchmarks.md); only Debian's node builds lack them."""
    facts = spec.images.guest
    return facts is None or not facts.node_snapshot


async def give_template_blob(
    vm: GuestVm, spec: VmSpec, node_cache: NodeStartupCache | None
) -> None:
    """The template's node startup snapshot: the host's copy of this machine's when the VM takes
    it in, else one built in the VM now, which the host keeps for other VMs when the template has
    no package layer (nothing but the image's code ran in it)."""
    key = blob_key(machine_identity(spec))
    if node_cache is not None and await node_cache.give(vm, key):
        return
    if not await _build_in_vm(vm) or node_cache is None or spec.layer is not None:
        return
    blob = await read_out(vm)
    if blob is not None:
        await node_cache.store(key, blob)


async def _build_in_vm(vm: GuestVm) -> bool:
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
        log.warning(
            "javascript memory snapshot without node's startup snapshot (exit %s): %s",
            outcome.exit_code,
            outcome.stderr[-300:],
        )
        return False
    return True
