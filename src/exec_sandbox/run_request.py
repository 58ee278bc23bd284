"""The options of one `run()` or `session()`, written once (`RunOptions`), and the request they
become at the API edge (`RunRequest`): validated, defaults applied, immutable, passed down.

`Scheduler`, `ClusterScheduler` and the integrations take the options as keyword arguments
typed by `RunOptions` (`**options: Unpack[RunOptions]`), so the list is not restated per
method. `RunRequest.make()` is the one place that checks them: bad input raises an
InputValidationError (or TypeError for an unknown keyword) before any VM starts. A request
holds no callback (they are `Callbacks`, beside it), so it pickles: the cluster sends it to a
host as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypedDict

from . import limits
from .config import SchedulerConfig
from .errors import InputValidationError
from .host_tools import HostTools, ToolFunction
from .models import Language, LanguageName, PortMapping
from .network.request import NetworkRequest, network_request_of
from .network.secrets import Secret
from .packages.specs import PackageSpec, validate_packages
from .validation import (
    validate_code,
    validate_disk,
    validate_env,
    validate_language,
    validate_memory,
    validate_template_name,
    validate_timeout,
    validate_vcpus,
)
from .vm.execution import OutputCallback
from .volumes import Volume, VolumeAttach, VolumeMount, validate_volumes

if TYPE_CHECKING:
    from .models import Template


class RunOptions(TypedDict, total=False):
    """The keyword arguments of `run()` and `session()`, as the README documents them. Every one
    may be left out: `RunRequest.make()` gives the defaults (the scheduler config's for time and
    memory)."""

    language: LanguageName  # "typescript"/"ts" run as "javascript" (models.LANGUAGE_ALIASES)
    packages: Sequence[str] | None
    timeout_seconds: float | None
    memory_mb: int | None
    vcpus: int | None
    disk_mb: int | None
    template: str | None
    allow_network: bool
    allowed_domains: Sequence[str] | None
    env_vars: Mapping[str, str] | None
    expose_ports: Sequence[int | PortMapping] | None
    secrets: Sequence[Secret] | None
    http_headers: Mapping[str, Mapping[str, str]] | None
    on_stdout: OutputCallback | None
    on_stderr: OutputCallback | None
    on_boot_log: OutputCallback | None
    tools: Mapping[str, ToolFunction] | None
    volumes: Mapping[str, Volume | VolumeMount | str] | None


@dataclass(frozen=True)
class Callbacks:
    """The call's host-side callables (RunOptions' on_* and tools): where its output goes and
    what its code may call on the host. Kept beside a request, never in it."""

    on_stdout: OutputCallback | None = None
    on_stderr: OutputCallback | None = None
    on_boot_log: OutputCallback | None = None
    tools: HostTools | None = None

    @classmethod
    def of(cls, options: RunOptions) -> Callbacks:
        """The options' callables; InputValidationError for bad tools."""
        return cls(
            options.get("on_stdout"),
            options.get("on_stderr"),
            options.get("on_boot_log"),
            HostTools.of(options.get("tools")),
        )


NO_CALLBACKS = Callbacks()


@dataclass(frozen=True)
class RunRequest:
    """One run() (code given) or session() (code None), validated. Time and memory are None
    where the caller gave none and the scheduler's defaults are still to be applied
    (`with_defaults`): a cluster's hosts apply their own, as a local scheduler does."""

    language: Language
    code: bytes | None
    timeout_seconds: float | None
    memory_mb: int | None
    # Virtual CPUs of the VM (None: the template's, else 1); the pool serves the same default.
    vcpus: int | None
    # The work disk's size (/home/user and /tmp; None: the config's default_disk_mb).
    disk_mb: int | None
    # The template the VM runs (templates/): its name, resolved by the scheduler, which also
    # applies the template's memory and vCPU defaults before the config's.
    template: str | None
    # The call's own packages (the scheduler adds its default set), of packages_language: the
    # session's, or (integrations) python for the python3 of a shell session.
    packages: tuple[PackageSpec, ...]
    packages_language: Language
    env_vars: tuple[tuple[str, str], ...]
    network: NetworkRequest | None
    # Volumes (volumes/): where each goes in the guest, which one, read-only or not. A VM with
    # volumes is cold-booted and never pooled or snapshotted (docs/design.md, "Volumes").
    volumes: tuple[VolumeAttach, ...] = ()

    @classmethod
    def make(
        cls,
        options: RunOptions,
        config: SchedulerConfig,
        *,
        code: str | None,
        packages_language: Language | None = None,
        defaults: bool = True,
    ) -> RunRequest:
        """The request of code (None: a session) with options under config's package policy,
        and config's time and memory defaults unless `defaults` is False. Raises TypeError for a
        keyword that is not an option (as a signature would), InputValidationError for a bad
        value."""
        unknown = sorted(set(options) - set(RunOptions.__annotations__))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
        language = validate_language(options.get("language", "python"))
        code_bytes = None if code is None else validate_code(code)
        timeout = options.get("timeout_seconds")
        if timeout is not None:
            validate_timeout(timeout)
        memory = options.get("memory_mb")
        if memory is not None:
            memory = validate_memory(memory)
        vcpus = options.get("vcpus")
        if vcpus is not None:
            vcpus = validate_vcpus(vcpus)
        disk = options.get("disk_mb")
        if disk is not None:
            disk = validate_disk(disk)
        template = options.get("template")
        if template == "default":  # the default image, as build_template(base="default") means
            template = None
        if template is not None:
            template = validate_template_name(template)
            if options.get("packages"):
                raise InputValidationError(
                    "packages= cannot be added to a template (its python or node is not the "
                    "default image's): install them in the template's build steps"
                )
        env_vars = options.get("env_vars")
        validate_env(env_vars)
        packages_language = (
            language if packages_language is None else validate_language(packages_language)
        )
        packages = validate_packages(
            options.get("packages"), packages_language, strict=config.enable_package_validation
        )
        network = network_request_of(options)
        if network is not None and network.secrets:
            clash = sorted({s.name for s in network.secrets} & set(env_vars or {}))
            if clash:
                raise InputValidationError(f"{clash[0]} is both a secret and in env_vars")
        request = cls(
            language=language,
            code=code_bytes,
            timeout_seconds=timeout,
            memory_mb=memory,
            vcpus=vcpus,
            disk_mb=disk,
            template=template,
            packages=packages,
            packages_language=packages_language,
            env_vars=tuple((env_vars or {}).items()),
            network=network,
            volumes=validate_volumes(options.get("volumes")),
        )
        return request.with_defaults(config) if defaults else request

    def with_defaults(
        self, config: SchedulerConfig, template: Template | None = None
    ) -> RunRequest:
        """This request with the template's memory and vCPUs, else config's time and memory
        and one vCPU, where it has none."""
        memory = self.memory_mb
        vcpus = self.vcpus
        if template is not None:
            memory = template.memory_mb if memory is None else memory
            vcpus = template.vcpus if vcpus is None else vcpus
        return replace(
            self,
            timeout_seconds=(
                config.default_timeout_seconds
                if self.timeout_seconds is None
                else self.timeout_seconds
            ),
            memory_mb=config.default_memory_mb if memory is None else memory,
            vcpus=limits.DEFAULT_VCPUS if vcpus is None else vcpus,
            disk_mb=config.default_disk_mb if self.disk_mb is None else self.disk_mb,
        )

    @property
    def timeout(self) -> float:
        """The timeout in seconds, defaults applied (ValueError before `with_defaults`)."""
        if self.timeout_seconds is None:
            raise ValueError("the request's defaults were not applied (with_defaults)")
        return self.timeout_seconds

    @property
    def memory(self) -> int:
        """Guest RAM in MB, defaults applied (ValueError before `with_defaults`)."""
        if self.memory_mb is None:
            raise ValueError("the request's defaults were not applied (with_defaults)")
        return self.memory_mb

    @property
    def disk(self) -> int:
        """The work disk's size in MB, defaults applied (ValueError before `with_defaults`)."""
        if self.disk_mb is None:
            raise ValueError("the request's defaults were not applied (with_defaults)")
        return self.disk_mb

    @property
    def cpus(self) -> int:
        """Virtual CPUs, defaults applied (ValueError before `with_defaults`)."""
        if self.vcpus is None:
            raise ValueError("the request's defaults were not applied (with_defaults)")
        return self.vcpus

    @property
    def timeout_ms(self) -> int:
        return validate_timeout(self.timeout)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.env_vars)

    @property
    def wire_env(self) -> list[tuple[bytes, bytes]]:
        """The variables as the guest protocol carries them (checked by make(): encoded only)."""
        return [(name.encode(), value.encode()) for name, value in self.env_vars]
