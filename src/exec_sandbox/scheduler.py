"""Scheduler: the entry point. Owns every VM it starts and destroys them all on exit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

from . import _logging, host, limits
from ._vm import (
    EXIT_STDERR_LIMIT,
    EXIT_STDOUT_LIMIT,
    ExecRequest,
    GuestVm,
    OutputCallback,
    VmSpec,
)
from .config import SchedulerConfig
from .errors import OutputLimitError, PackageNotAllowedError, SandboxError, VmConfigError
from .images import GuestImages, load_images
from .jail import jail_options, usage_figures
from .models import ExecutionResult, Language, PortMapping, TimingBreakdown
from .session import Session
from .validation import (
    validate_code,
    validate_env,
    validate_language,
    validate_memory,
    validate_timeout,
)

log = logging.getLogger("exec_sandbox")


class Scheduler:
    """Runs code in disposable microVMs.

    Use as `async with Scheduler(config) as scheduler:`; leaving the block kills every VM the
    scheduler still owns. At most `config.max_concurrent_vms` VMs run at once; further calls wait.
    """

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        _logging.configure_from_env()
        self.config = config if config is not None else SchedulerConfig()
        self._admission = asyncio.Semaphore(self.config.max_concurrent_vms or 1)
        self._vms: set[GuestVm] = set()
        self._sessions: set[Session] = set()
        self._images: GuestImages | None = None
        self._accel = ""
        self._started = False
        self._closed = False

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:  # fmt: skip
        await self.close()

    async def start(self) -> None:
        """Find QEMU, the accelerator and the images; raises VmPermanentError if one is missing."""
        if self._started:
            return
        self._images = load_images(self.config.images_dir)
        loop = asyncio.get_running_loop()
        # The KVM probe starts QEMU once and the TSC measurement sleeps: keep both off the loop.
        await loop.run_in_executor(None, host.qemu_binary)
        self._accel = await loop.run_in_executor(None, host.accelerator)
        await loop.run_in_executor(None, host.tsc_khz)
        self._started = True
        log.debug("scheduler ready: accel=%s images=%s", self._accel, self._images)

    async def close(self) -> None:
        """Kill every VM this scheduler still owns. Idempotent."""
        self._closed = True
        for session in list(self._sessions):
            await session.close()
        for vm in list(self._vms):
            vm.close()
        self._vms.clear()

    @property
    def accelerator(self) -> str:
        return self._accel

    async def run(
        self,
        code: str,
        *,
        language: Language = "python",
        packages: Sequence[str] | None = None,
        timeout_seconds: int | None = None,
        memory_mb: int | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        env_vars: Mapping[str, str] | None = None,
        expose_ports: Sequence[int | PortMapping] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_boot_log: OutputCallback | None = None,
    ) -> ExecutionResult:
        """Run `code` in a fresh VM that is destroyed afterwards.

        Returns the result for any exit of the code (0, n, 128+signal, -1 on timeout). Raises
        InputValidationError for bad input (before any VM starts), OutputLimitError when the
        code printed more than the limits, and TransientError/PermanentError/CommunicationError
        for infrastructure failures.
        """
        started = time.monotonic()
        language = validate_language(language)
        code_bytes = validate_code(code)
        timeout = (
            self.config.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        )
        timeout_ms = validate_timeout(timeout)
        memory = validate_memory(self.config.default_memory_mb if memory_mb is None else memory_mb)
        env = validate_env(env_vars)
        _refuse_unsupported(packages, allow_network, allowed_domains, expose_ports)
        if self._closed:
            raise SandboxError("the scheduler is closed")
        await self.start()
        assert self._images is not None

        async with self._admission:
            spec = VmSpec(
                qemu_binary=host.qemu_binary(),
                images=self._images,
                accel=self._accel,
                memory_mb=memory,
                kernel_cmdline_extra=_kernel_cmdline_extra(),
                jail=jail_options(memory),
                qemu_sandbox=True,
            )
            spawn_at = time.monotonic()
            vm = await GuestVm.boot(
                spec, boot_timeout=limits.BOOT_TIMEOUT_SECONDS, on_boot_log=on_boot_log
            )
            self._vms.add(vm)
            try:
                ready_at = time.monotonic()
                outcome = await vm.execute(
                    ExecRequest(
                        language=language,
                        code=code_bytes,
                        timeout_ms=timeout_ms,
                        env=env,
                        stdout_limit=limits.STDOUT_LIMIT_BYTES,
                        stderr_limit=limits.STDERR_LIMIT_BYTES,
                        on_stdout=on_stdout,
                        on_stderr=on_stderr,
                    )
                )
                done_at = time.monotonic()
            finally:
                vm.close()
                self._vms.discard(vm)
            cpu_ms, peak_mb = usage_figures(vm.resource_usage())

        if outcome.flags & EXIT_STDOUT_LIMIT:
            raise OutputLimitError(f"stdout exceeded {limits.STDOUT_LIMIT_BYTES} bytes")
        if outcome.flags & EXIT_STDERR_LIMIT:
            raise OutputLimitError(f"stderr exceeded {limits.STDERR_LIMIT_BYTES} bytes")
        stderr = outcome.stderr
        if outcome.exit_code == -1:
            stderr += f"\nExecution timed out after {timeout} seconds\n"
        return ExecutionResult(
            stdout=outcome.stdout,
            stderr=stderr,
            exit_code=outcome.exit_code,
            execution_time_ms=outcome.duration_us // 1000,
            external_cpu_time_ms=cpu_ms,
            external_memory_peak_mb=peak_mb,
            timing=TimingBreakdown(
                setup_ms=_ms(spawn_at - started),
                boot_ms=_ms(ready_at - spawn_at),
                execute_ms=_ms(done_at - ready_at),
                total_ms=_ms(time.monotonic() - started),
            ),
        )


    async def session(
        self,
        *,
        language: Language = "python",
        packages: Sequence[str] | None = None,
        timeout_seconds: int | None = None,
        memory_mb: int | None = None,
        allow_network: bool = False,
        allowed_domains: Sequence[str] | None = None,
        env_vars: Mapping[str, str] | None = None,
        expose_ports: Sequence[int | PortMapping] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_boot_log: OutputCallback | None = None,
    ) -> Session:
        """Boot a VM for a stateful session (see session.py). The session holds one admission
        slot until it is closed; timeout_seconds, env_vars and the callbacks are defaults for
        each exec()."""
        language = validate_language(language)
        timeout = self.config.default_timeout_seconds if timeout_seconds is None else timeout_seconds
        validate_timeout(timeout)
        memory = validate_memory(self.config.default_memory_mb if memory_mb is None else memory_mb)
        validate_env(env_vars)
        _refuse_unsupported(packages, allow_network, allowed_domains, expose_ports)
        if self._closed:
            raise SandboxError("the scheduler is closed")
        await self.start()
        assert self._images is not None

        await self._admission.acquire()
        try:
            spec = VmSpec(
                qemu_binary=host.qemu_binary(),
                images=self._images,
                accel=self._accel,
                memory_mb=memory,
                kernel_cmdline_extra=_kernel_cmdline_extra(),
                jail=jail_options(memory),
                qemu_sandbox=True,
            )
            spawn_at = time.monotonic()
            vm = await GuestVm.boot(
                spec, boot_timeout=limits.BOOT_TIMEOUT_SECONDS, on_boot_log=on_boot_log
            )
        except BaseException:
            self._admission.release()
            raise
        self._vms.add(vm)

        def on_close(session: Session) -> None:
            self._sessions.discard(session)
            self._vms.discard(vm)
            self._admission.release()

        session = Session(
            vm,
            language=language,
            default_timeout_seconds=timeout,
            default_env=env_vars,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            idle_timeout_seconds=self.config.session_idle_timeout_seconds,
            on_close=on_close,
            boot_ms=_ms(time.monotonic() - spawn_at),
        )
        self._sessions.add(session)
        try:
            await session.start_repl()
        except BaseException:
            await session.close()
            raise
        return session


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _kernel_cmdline_extra() -> str:
    khz = host.tsc_khz()
    return f"tsc_early_khz={khz}" if khz > 0 else ""


def _refuse_unsupported(packages: Sequence[str] | None, allow_network: bool,
                        allowed_domains: Sequence[str] | None,
                        expose_ports: Sequence[int | PortMapping] | None) -> None:  # fmt: skip
    """Features of the API that this version does not implement yet fail loudly, never silently."""
    if packages:
        raise PackageNotAllowedError("installing packages is not supported by this version yet")
    if allow_network or allowed_domains:
        raise VmConfigError("network access is not supported by this version yet")
    if expose_ports:
        raise VmConfigError("exposing ports is not supported by this version yet")
