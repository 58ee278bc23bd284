"""Building a template: everything of it that touches image content runs in a builder VM.

The host's part is small on purpose (docs/security.md, "Templates"): it imports the source image
with skopeo and checks its digests (oci.py), copies the files of `Copy` steps, and packs both
with a plan (`plan.json`) into a read-only EROFS *source disk*. A builder VM (the default images,
`sbx.builder=1` on its command line, which makes the agent run this build's commands as root)
gets that disk, the base template's disk when there is one, and an empty sparse *output disk*.
Its build script (guest/template/build.sh) unpacks the layers with umoci or copies the base
tree, runs each step, and writes the template's EROFS image onto the output disk; the host
truncates the output to the size the script reports, hashes it and publishes it, never opening
it. The only guest bytes the host reads are the exit statuses, the output it shows, and the
finish line (a bounded JSON object, checked field by field).

Every build is keyed by its inputs (the builder's images, the source's manifest digest or the
base's digest, the steps with the content of copied files): the same inputs again are a cache
hit and build nothing.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputValidationError, PackageBuildError, TemplateBuildError, TemplateError
from ..images.catalog import GuestImages
from ..models import Template
from ..network.request import NetworkRequest, parse_network_request
from ..packages.erofs import pack
from ..validation import validate_memory, validate_template_name, validate_vcpus
from ..vm.binding import EXIT_STDERR_LIMIT, EXIT_STDOUT_LIMIT, EXIT_TIMED_OUT, PROTOCOL_LIMITS
from ..vm.execution import ExecRequest
from ..vm.guest import GuestVm
from ..vm.spec import Disk
from .oci import ImportedImage, import_image
from .steps import Copy, Step, validate_steps
from .store import TemplateStore

log = logging.getLogger("exec_sandbox")

# What a template is built from when no image is given.
DEFAULT_BASE = "default"
# Changes whenever what the builder does with the same inputs changes: part of the inputs key.
_BUILD_FORMAT = 1
_SCRIPT = "/usr/lib/sbx/template-build"
# One step's (and prepare's, finish's) longest run: the agent's longest exec.
_STEP_TIMEOUT_MS = PROTOCOL_LIMITS["TIMEOUT_MS_MAX"]
# Output of one step kept for its error (the whole of it streams to on_progress).
_OUTPUT_KEPT = 64 * 1024
# A step's output (each of stdout and stderr) past this kills it: a package manager's output
# fits many times over, and the host holds no more of a hostile step's than this.
_STEP_OUTPUT_MAX = 16 << 20
_FINISH_LINE_MAX = 64 * 1024
_VERSION = re.compile(r"[\x20-\x7e]{1,64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Progress = Callable[[str], None]
# Starts the builder VM with these disks (and network, when the build may reach names) and
# owns it for the block (the scheduler's: admission, registry, network relay).
BuilderVms = Callable[
    [tuple[Disk, ...], NetworkRequest | None], AbstractAsyncContextManager[GuestVm]
]


@dataclass(frozen=True)
class BuildRequest:
    """build_template()'s arguments, checked (InputValidationError) before anything runs."""

    name: str
    image: str | Path | None
    base: str
    steps: tuple[Step, ...]
    network: NetworkRequest | None
    memory_mb: int | None
    vcpus: int | None

    @classmethod
    def make(
        cls,
        name: str,
        *,
        image: str | os.PathLike[str] | None,
        base: str,
        steps: Sequence[Step],
        allowed_domains: Sequence[str] | None,
        memory_mb: int | None,
        vcpus: int | None,
    ) -> BuildRequest:
        name = validate_template_name(name)
        if name == DEFAULT_BASE:
            raise InputValidationError(f"{DEFAULT_BASE!r} names the default image: pick another")
        source: str | Path | None
        if image is None:
            source = None
        elif isinstance(image, os.PathLike):
            source = Path(image)
        elif isinstance(image, str) and image.strip():
            source = image.strip()
        else:
            raise InputValidationError(f"image must be a reference or a path, got {image!r}")
        if image is not None and base != DEFAULT_BASE:
            raise InputValidationError("give image= or base=, not both")
        if base != DEFAULT_BASE:
            base = validate_template_name(base)
        checked = validate_steps(steps)
        network = (
            None if allowed_domains is None else parse_network_request(True, allowed_domains, None)
        )
        return cls(
            name=name,
            image=source,
            base=base,
            steps=checked,
            network=network,
            memory_mb=None if memory_mb is None else validate_memory(memory_mb),
            vcpus=None if vcpus is None else validate_vcpus(vcpus),
        )

    @property
    def source_kind(self) -> str:
        """What the build script starts from: "oci", "default" or "template"."""
        if self.image is not None:
            return "oci"
        return "default" if self.base == DEFAULT_BASE else "template"

    @property
    def description(self) -> str:
        """Template.source: the image, "default" or "template:NAME", and how many steps."""
        if self.image is not None:
            start = str(self.image)
        else:
            start = self.base if self.base == DEFAULT_BASE else f"template:{self.base}"
        return f"{start} + {len(self.steps)} steps" if self.steps else start


async def build_template(
    request: BuildRequest,
    *,
    store: TemplateStore,
    images: GuestImages,
    builder_vms: BuilderVms,
    max_bytes: int,
    progress: Progress | None = None,
) -> Template:
    """The template of request: the cached one for the same inputs, else built now. Raises
    TemplateError (and its TemplateBuildError for a step that failed); nothing half-built is
    left behind."""
    try:
        return await _build_or_find(request, store, images, builder_vms, max_bytes, progress)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise TemplateError(
                f"the disk holding the template cache is full ({exc}): free some space or set "
                "SchedulerConfig.template_cache_dir to a larger disk"
            ) from None
        raise


async def _build_or_find(
    request: BuildRequest,
    store: TemplateStore,
    images: GuestImages,
    builder_vms: BuilderVms,
    max_bytes: int,
    progress: Progress | None,
) -> Template:
    build = _Build(request, store, builder_vms, max_bytes, _Say(progress), time.monotonic())
    base: Template | None = None
    if request.source_kind == "template":
        base = await store.get(request.base)
        if base is None:
            raise TemplateError(f"no template named {request.base!r} to build on")
    async with store.build_dir() as staging:
        source = staging / "source"
        source.mkdir()
        imported: ImportedImage | None = None
        if request.image is not None:
            build.say(f"importing {request.image}")
            imported = await import_image(
                request.image, source, progress=build.say, max_bytes=max_bytes
            )
            build.say(
                f"imported {imported.layers} layers, {imported.size_bytes / 1e6:.1f} MB "
                f"({imported.manifest_digest})"
            )
        copies = await asyncio.to_thread(_stage_copies, request.steps, source / "copy")
        key = _inputs_key(request, images, imported, base, copies)
        # One build per inputs at a time (in this process and others): the second waits and
        # then finds the first one's template.
        waiting = functools.partial(build.say, "waiting for a build of the same inputs to end")
        async with store.build_lock(key, waiting):
            cached = await store.get_by_inputs(key)
            if cached is not None:
                build.say(f"cached: {cached.digest}")
                return await store.name(
                    request.name, cached, memory_mb=request.memory_mb, vcpus=request.vcpus
                )
            return await build.run(staging, base, key)


@dataclass(frozen=True)
class _Build:
    request: BuildRequest
    store: TemplateStore
    builder_vms: BuilderVms
    max_bytes: int
    say: _Say
    started: float

    async def run(self, staging: Path, base: Template | None, key: str) -> Template:
        """Pack the sources staged in staging/source, build in a builder VM, publish."""
        request, say = self.request, self.say
        source = staging / "source"
        await asyncio.to_thread((source / "plan.json").write_text, json.dumps(_plan(request)))
        say("packing the build's sources")
        source_disk = staging / "source.erofs"
        try:
            await pack(source, source_disk, normalize=False)
        except PackageBuildError as exc:
            raise TemplateError(f"packing the build's sources failed: {exc}") from None
        output = staging / "output.raw"
        await asyncio.to_thread(_sparse, output, self.max_bytes)
        disks = [Disk(source_disk, "source")]
        if base is not None:
            disks.append(Disk(await self.store.verified(base.digest), "base"))
        disks.append(Disk(output, "output", writable=True))
        say("starting the builder VM")
        async with self.builder_vms(tuple(disks), request.network) as vm:
            await _exec(vm, "prepare", None, say)
            for index, step in enumerate(request.steps):
                say(f"step {index + 1}/{len(request.steps)}: {_describe(step)}")
                await _exec(vm, f"step {index}", index, say)
            say("writing the template image")
            finish = await _exec(vm, "finish", None, say, quiet=True)
        facts = _finish_facts(finish, self.max_bytes)
        image = staging / "image.erofs"
        digest = await asyncio.to_thread(_seal, output, image, facts.size)
        template = Template(
            name=request.name,
            digest=digest,
            size_bytes=facts.size,
            languages=facts.languages,
            env=facts.env,
            workdir=facts.workdir,
            memory_mb=request.memory_mb,
            vcpus=request.vcpus,
            source=request.description,
            created_at=time.time(),
            build_ms=int((time.monotonic() - self.started) * 1000),
        )
        published = await self.store.publish(template, image, inputs_key=key)
        say(f"template {request.name}: {digest} ({facts.size / 1e6:.1f} MB)")
        return published


def _describe(step: Step) -> str:
    """A step as a Sandboxfile line (progress and errors)."""
    plan = step.plan()
    op = plan["op"]
    if op == "run":
        return f"RUN {plan['cmd']}" + (f" (as {plan['user']})" if plan.get("user") else "")
    if op == "copy":
        assert isinstance(step, Copy)
        return f"COPY {step.source} {step.dest}{'/' if step.into else ''}"
    if op == "env":
        return "ENV " + " ".join(f"{k}={v}" for k, v in plan["vars"].items())
    if op == "workdir":
        return f"WORKDIR {plan['path']}"
    return f"USER {plan['name']}"


class _Say:
    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress

    def __call__(self, line: str) -> None:
        # DEBUG: a RUN line may carry a token, and the caller's on_progress shows it anyway.
        log.debug("template build: %s", line.rstrip())
        if self._progress is not None:
            self._progress(line if line.endswith("\n") else line + "\n")

    def output(self, chunk: str) -> None:
        if self._progress is not None:
            self._progress(chunk)


async def _exec(
    vm: GuestVm, command: str, step: int | None, say: _Say, *, quiet: bool = False
) -> str:
    """Run one build script command in the builder VM; its stdout, or TemplateBuildError."""
    outcome = await vm.execute(
        ExecRequest(
            language="raw",
            code=f"exec {_SCRIPT} {command}".encode(),
            timeout_ms=_STEP_TIMEOUT_MS,
            env=[],
            stdout_limit=_STEP_OUTPUT_MAX,
            stderr_limit=_STEP_OUTPUT_MAX,
            on_stdout=None if quiet else say.output,
            on_stderr=say.output,
        )
    )
    if outcome.exit_code == 0:
        return outcome.stdout
    output = (outcome.stdout + outcome.stderr)[-_OUTPUT_KEPT:]
    timed_out = bool(outcome.flags & EXIT_TIMED_OUT)
    what = f"step {step + 1}" if step is not None else command
    if timed_out:
        reason = f"timed out after {_STEP_TIMEOUT_MS // 1000} s"
    elif outcome.flags & (EXIT_STDOUT_LIMIT | EXIT_STDERR_LIMIT):
        reason = f"killed: its output passed {_STEP_OUTPUT_MAX >> 20} MB"
    else:
        reason = f"exited with status {outcome.exit_code}"
    last = outcome.stderr.strip().splitlines()[-1:] or outcome.stdout.strip().splitlines()[-1:]
    raise TemplateBuildError(
        f"template build failed at {what}: {reason}" + (f": {last[0][:500]}" if last else ""),
        step=step,
        output=output,
        exit_code=None if timed_out else outcome.exit_code,
    )


@dataclass(frozen=True)
class _Facts:
    size: int
    languages: dict[str, str]
    env: dict[str, str]
    workdir: str


def _finish_facts(stdout: str, max_bytes: int) -> _Facts:
    """The finish line of the build script, from the builder VM: checked field by field."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines or len(lines[-1]) > _FINISH_LINE_MAX:
        raise TemplateError("the builder VM reported no template")
    try:
        raw = json.loads(lines[-1])
    except (ValueError, RecursionError):  # nesting deep enough blows the parser's stack
        raise TemplateError("the builder VM's report is not JSON") from None
    if not isinstance(raw, dict):
        raise TemplateError("the builder VM's report is not an object")
    size = raw.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 4096 <= size <= max_bytes:
        raise TemplateError(f"the builder VM reported a bad image size: {size!r}")
    languages_raw = raw.get("languages")
    if not isinstance(languages_raw, dict):
        raise TemplateError("the builder VM reported no languages")
    languages: dict[str, str] = {}
    for language in ("python", "javascript", "raw"):
        version = languages_raw.get(language)
        if version is None:
            continue
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            raise TemplateError(f"the builder VM reported a bad {language} version")
        languages[language] = version
    env_raw = raw.get("env", {})
    if not isinstance(env_raw, dict) or len(env_raw) > PROTOCOL_LIMITS["ENV_MAX_COUNT"]:
        raise TemplateError("the builder VM reported a bad environment")
    env: dict[str, str] = {}
    for name, value in env_raw.items():
        if (
            not _ENV_NAME.fullmatch(name)
            or len(name) > PROTOCOL_LIMITS["ENV_NAME_MAX"]
            or not isinstance(value, str)
            or len(value.encode()) > PROTOCOL_LIMITS["ENV_VALUE_MAX"]
            or "\x00" in value
        ):
            raise TemplateError(f"the builder VM reported a bad variable {name[:64]!r}")
        env[name] = value
    workdir = raw.get("workdir", "/home/user")
    if (
        not isinstance(workdir, str)
        or not workdir.startswith("/")
        or len(workdir) > 4096
        or "\x00" in workdir
        or "\n" in workdir
    ):
        raise TemplateError("the builder VM reported a bad working directory")
    return _Facts(size, languages, env, workdir)


def _plan(request: BuildRequest) -> dict[str, Any]:
    """plan.json: what the build script does, step by step (copy sources are copy/<index>/)."""
    return {"source": request.source_kind, "steps": [step.plan() for step in request.steps]}


def _stage_copies(steps: tuple[Step, ...], into: Path) -> dict[int, str]:
    """Copy each Copy step's source to into/<index>/ (a directory's contents, or the file);
    returns each one's content hash (names, modes, bytes, link targets) for the inputs key."""
    hashes: dict[int, str] = {}
    for index, step in enumerate(steps):
        if not isinstance(step, Copy):
            continue
        source = Path(step.source)
        target = into / str(index)
        try:
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True, copy_function=_copy_regular)
            else:
                target.mkdir(parents=True)
                _copy_regular(str(source), str(target / source.name))
        except OSError as exc:
            raise InputValidationError(f"Copy({str(source)!r}): {exc.strerror or exc}") from None
        hashes[index] = _tree_hash(target)
    return hashes


def _copy_regular(source: str, dest: str) -> None:
    """copy2 of a regular file only: a device or fifo in a Copy source would be read on the host
    (/dev/zero without end), and has no place in a template (the builder makes no nodes)."""
    if not stat.S_ISREG(os.stat(source).st_mode):
        raise InputValidationError(
            f"Copy: {source} is not a regular file, directory or symlink (a device, fifo or "
            "socket cannot be copied into a template)"
        )
    shutil.copy2(source, dest)


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            digest.update(f"{path.relative_to(root)}\0{st.st_mode:o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with path.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
            digest.update(b"\0")
    return digest.hexdigest()


def _inputs_key(
    request: BuildRequest,
    images: GuestImages,
    imported: ImportedImage | None,
    base: Template | None,
    copies: dict[int, str],
) -> str:
    """What makes two builds give the same template: the builder's images (its umoci, mkfs and
    script; the default base's tree), the source, the steps, and what their network reaches (a
    step that fetches gets another result with another allowance)."""
    source: str
    if imported is not None:
        source = imported.manifest_digest
    elif base is not None:
        source = base.digest
    else:
        source = DEFAULT_BASE
    plan = _plan(request)
    for index, content in copies.items():
        plan["steps"][index]["content"] = content
    material = json.dumps(
        {
            "format": _BUILD_FORMAT,
            "builder": [images.kernel_hash, images.rootfs_hash],
            "source": source,
            "plan": plan,
            "network": _network_key(request.network),
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _network_key(network: NetworkRequest | None) -> list[str] | None:
    if network is None:
        return None
    rules = network.rules or ()
    return sorted(f"{rule.name}:{rule.port}" for rule in rules)


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)


def _seal(output: Path, image: Path, size: int) -> str:
    """The image the builder wrote (the output disk's first `size` bytes) copied into a new file
    of the host's own, read-only, and hashed on the way. Never the output disk itself: QEMU
    wrote it, and the jail gave it to QEMU's user, who could change it later (a VM running the
    template has it open read-only, but a QEMU taken over could reopen a file its user owns)."""
    digest = hashlib.sha256()
    left = size
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with output.open("rb") as src:
            while left > 0:
                block = src.read(min(left, 1 << 20))
                if not block:
                    raise TemplateError("the builder's output disk is shorter than its report")
                digest.update(block)
                os.write(fd, block)
                left -= len(block)
        os.fchmod(fd, 0o444)
    finally:
        os.close(fd)
    output.unlink()
    return "sha256:" + digest.hexdigest()
