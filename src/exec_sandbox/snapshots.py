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
    <key>/meta.json   the key's inputs, the state's SHA-256 and the RAM size
A directory is built under a temporary name and published by rename, so readers see complete
snapshots only. An invalid one (missing file, other size, other hash, unreadable meta) is moved
aside and deleted: clones that still map its RAM file keep their pages (unlinked, not
truncated), and the next request cold-boots and rebuilds.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from ._vm import GuestVm, VmSpec
from .models import Language

log = logging.getLogger("exec_sandbox")

# Bump when the layout or the way templates are made changes: old snapshots then miss.
SNAPSHOT_FORMAT = 1
# A device-state stream of these VMs is ~50 KB; anything far larger is not ours.
_STATE_MAX_BYTES = 64 * 1024 * 1024
_META_MAX_BYTES = 64 * 1024
# Languages whose template holds a pre-started interpreter (PRESTART), parked before the RNG
# reseed and the save: a restored clone then serves its first run without starting one (the L1
# path costs a restore, not an interpreter start). Only where the parked process holds no
# user-space randomness that every clone would share: python seeds nothing a program sees before
# its code runs (`random` is imported on first use, after the clone's RESEED; os.urandom and
# secrets ask the kernel). Not node: V8 seeds Math.random when it starts. Not bash: $RANDOM.
# What clones of one python template do share: the str hash seed (set iteration order).
TEMPLATE_PRESTART_LANGUAGES: frozenset[Language] = frozenset({"python"})


@functools.cache
def qemu_version(qemu_binary: str) -> str:
    """`qemu --version`'s first line: a QEMU upgrade makes every snapshot stale."""
    out = subprocess.run([qemu_binary, "--version"], capture_output=True, text=True, timeout=30,
                         check=False)  # fmt: skip
    return (out.stdout.strip().splitlines() or ["unknown"])[0]


def snapshot_key(spec: VmSpec, language: Language) -> str:
    """Everything that changes what a restored VM would be: images, QEMU, accelerator, RAM,
    vCPUs, kernel command line, language (the warmed-up interpreter), the format."""
    inputs = {
        "format": SNAPSHOT_FORMAT,
        "kernel": spec.images.kernel_hash,
        "rootfs": spec.images.rootfs_hash,
        "qemu": qemu_version(spec.qemu_binary),
        "accel": spec.accel,
        "memory_mb": spec.memory_mb,
        "vcpus": spec.vcpus,
        "cmdline": spec.kernel_cmdline_extra,
        "language": language,
        "template_prestart": language in TEMPLATE_PRESTART_LANGUAGES,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{language}-{spec.memory_mb}m-{digest[:24]}"


@dataclass(frozen=True)
class Snapshot:
    key: str
    ram: Path
    state: Path


class SnapshotCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ram_files = RamFiles()

    def close(self) -> None:
        self.ram_files.close()

    def lookup(self, key: str, memory_mb: int) -> Snapshot | None:
        """The published snapshot for key if it is complete and intact, else None (an invalid
        one is logged and removed)."""
        directory = self.root / key
        if not directory.is_dir():
            return None
        problem = _check(directory, key, memory_mb)
        if problem:
            log.warning("memory snapshot %s is unusable (%s): removing it; cold boot instead",
                        directory, problem)  # fmt: skip
            self.invalidate(key)
            return None
        return Snapshot(key, directory / "ram", directory / "state")

    def invalidate(self, key: str) -> None:
        directory = self.root / key
        try:
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=self.root))
            os.rename(directory, trash / "old")
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    async def build(self, spec: VmSpec, language: Language, key: str, *,
                    boot_timeout: float) -> Snapshot:  # fmt: skip
        """Boot a template VM of spec, warm `language` up, save it, publish it under key."""
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=self.root))
        published = False
        try:
            # Opened and sized here: the jailed QEMU could neither open it by path (read-only
            # mounts) nor grow it (RLIMIT_FSIZE 0); it writes the RAM through its shared mapping.
            ram_fd = os.open(work / "ram", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(ram_fd, spec.memory_mb * 1024 * 1024)
                template_spec = replace(spec, mem_fd=ram_fd, mem_shared=True, qmp=True)
                vm = await GuestVm.boot(template_spec, boot_timeout=boot_timeout)
            finally:
                os.close(ram_fd)  # QEMU has its own copy (fd 6)
            try:
                await vm.warm_up(language)
                if language in TEMPLATE_PRESTART_LANGUAGES:
                    await vm.prestart(language)
                # Reseed right before saving: the template's CRNG is then young, so the guest
                # kernel would not reseed it on its own for a while after a restore, and every
                # clone depends on the RESEED it gets (the security test relies on this to
                # notice a clone that was not reseeded). It also stamps the clock.
                await vm.reseed()
                await vm.save_snapshot(str(work / "state"))
            finally:
                vm.close()  # the RAM file must not change after the state was saved
            state_hash = await asyncio.get_running_loop().run_in_executor(
                None, _sha256, work / "state"
            )
            meta = {
                "format": SNAPSHOT_FORMAT,
                "key": key,
                "state_sha256": state_hash,
                "ram_bytes": spec.memory_mb * 1024 * 1024,
            }
            (work / "meta.json").write_text(json.dumps(meta))
            try:
                os.rename(work, self.root / key)
            except OSError:
                # Somebody else published this key first: theirs is as good as ours.
                shutil.rmtree(work, ignore_errors=True)
            published = True
        finally:
            if not published:
                shutil.rmtree(work, ignore_errors=True)
        snapshot = self.lookup(key, spec.memory_mb)
        if snapshot is None:
            raise RuntimeError(f"memory snapshot {key} vanished after it was built")
        return snapshot


def _check(directory: Path, key: str, memory_mb: int) -> str | None:
    try:
        with open(directory / "meta.json", "rb") as f:
            raw = f.read(_META_MAX_BYTES + 1)
        if len(raw) > _META_MAX_BYTES:
            return "meta.json too large"
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            return "meta.json is not an object"
        if meta.get("format") != SNAPSHOT_FORMAT or meta.get("key") != key:
            return "meta.json is for another format or key"
        ram_size = (directory / "ram").stat().st_size
        if ram_size != memory_mb * 1024 * 1024 or meta.get("ram_bytes") != ram_size:
            return f"RAM file has {ram_size} bytes"
        state = directory / "state"
        size = state.stat().st_size
        if size == 0 or size > _STATE_MAX_BYTES:
            return f"state file has {size} bytes"
        if _sha256(state) != meta.get("state_sha256"):
            return "state file does not match its hash"
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


class RamFiles:
    """Sealed memfd copies of snapshot RAM files, one per published file, for clones.

    A clone's QEMU (share=off) opens its RAM read-write (QEMU 7.2 has no read-only backing file
    with a writable private mapping). Given the cache file, a compromised clone could write to
    the template every later clone maps. A memfd sealed against writes, growth and shrinking
    can still be mapped privately and copy-on-write, but write(2) and shared writable mappings of
    it fail for everybody. Holes in the RAM file stay holes: only data ranges are copied."""

    def __init__(self) -> None:
        self._fds: dict[tuple[str, int, int], int] = {}
        self._lock = threading.Lock()  # fd_for runs in executor threads

    def fd_for(self, snapshot: Snapshot) -> int:
        """The sealed memfd for this snapshot's RAM file (made on first use; blocking: call it
        from an executor). Valid until close()."""
        with self._lock:
            st = os.stat(snapshot.ram)
            ident = (str(snapshot.ram), st.st_ino, st.st_mtime_ns)
            fd = self._fds.get(ident)
            if fd is None:
                fd = _sealed_copy(snapshot.ram, st.st_size)
                for old in [k for k in self._fds if k[0] == ident[0]]:
                    os.close(self._fds.pop(old))  # a rebuilt file: its old copy is unused now
                self._fds[ident] = fd
            return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _sealed_copy(path: Path, size: int) -> int:
    memfd = os.memfd_create("sbx-snapshot-ram", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, size)
        with open(path, "rb", buffering=0) as f:
            src = f.fileno()
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(src, offset, os.SEEK_DATA)
                except OSError:
                    break  # only a hole is left
                end = os.lseek(src, start, os.SEEK_HOLE)
                os.lseek(memfd, start, os.SEEK_SET)  # sendfile writes at memfd's position
                while start < end:
                    n = os.sendfile(memfd, src, start, min(end - start, 1 << 24))
                    if n <= 0:
                        raise OSError(f"short copy of {path}")
                    start += n
                offset = end
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)  # fmt: skip
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
