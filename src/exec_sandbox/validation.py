"""Validation of caller input. Everything here runs before any VM is touched, and raises a
subclass of InputValidationError (or VmConfigError for resource settings) with a message that
names the offending value."""

from __future__ import annotations

import re
from collections.abc import Mapping

from . import limits
from .errors import CodeValidationError, EnvVarValidationError, InputValidationError
from .models import LANGUAGE_ALIASES, LANGUAGE_NAMES, LANGUAGES, Language

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables that make an interpreter or the loader run code other than the code we were given.
# Matched case-insensitively; any name starting with LD_ is refused too.
_DENIED_ENV = frozenset(
    name.upper()
    for name in (
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONWARNINGS",
        "PYTHONBREAKPOINT",
        "PYTHONINSPECT",
        "PYTHONSAFEPATH",
        "NODE_OPTIONS",
        "NODE_PATH",
        "NODE_REPL_EXTERNAL_MODULE",
        "NODE_EXTRA_CA_CERTS",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
        "BASH_XTRACEFD",
        "GCONV_PATH",
        "LOCPATH",
        "HOSTALIASES",
        "MALLOC_CHECK_",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "RUBYOPT",
        "RUBYLIB",
        "GIT_EXEC_PATH",
        "GIT_SSH_COMMAND",
        "GIT_CONFIG_GLOBAL",
        "GIT_CONFIG_SYSTEM",
    )
)
# Control characters other than tab and newline have no business in an environment value.
_ENV_VALUE_BAD = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def validate_code(code: object) -> bytes:
    """Return the code as UTF-8 bytes, or raise CodeValidationError."""
    if not isinstance(code, str):
        raise CodeValidationError(f"code must be a str, got {type(code).__name__}")
    if not code.strip():
        raise CodeValidationError("code is empty")
    if "\x00" in code:
        raise CodeValidationError("code contains a NUL byte")
    try:
        data = code.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CodeValidationError(f"code is not valid UTF-8: {exc}") from None
    if len(data) > limits.CODE_MAX_BYTES:
        raise CodeValidationError(
            f"code is {len(data)} bytes, more than the limit of {limits.CODE_MAX_BYTES}"
        )
    return data


def validate_language(language: object) -> Language:
    """The runtime of a language name: "typescript" and "ts" run as "javascript"."""
    if isinstance(language, str) and language in LANGUAGE_ALIASES:
        return LANGUAGE_ALIASES[language]
    if language not in LANGUAGES:
        raise CodeValidationError(
            f"unknown language {language!r}: expected one of {', '.join(LANGUAGE_NAMES)}"
        )
    return language


def validate_timeout(timeout_seconds: object) -> int:
    """The timeout in ms: 1 s .. MAX_TIMEOUT_SECONDS, or 0 (no limit: the code runs until it
    ends, as a framework's 0 means)."""
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
        raise InputValidationError(f"timeout_seconds must be a number, got {timeout_seconds!r}")
    if timeout_seconds == 0:
        return limits.NO_TIMEOUT_MS
    if not limits.MIN_TIMEOUT_SECONDS <= timeout_seconds <= limits.MAX_TIMEOUT_SECONDS:
        raise InputValidationError(
            f"timeout_seconds must be between {limits.MIN_TIMEOUT_SECONDS} and "
            f"{limits.MAX_TIMEOUT_SECONDS}, or 0 for no limit, got {timeout_seconds}"
        )
    return int(timeout_seconds * 1000)


def validate_memory(memory_mb: object) -> int:
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int):
        raise InputValidationError(f"memory_mb must be an integer, got {memory_mb!r}")
    if not limits.MIN_MEMORY_MB <= memory_mb <= limits.MAX_MEMORY_MB:
        raise InputValidationError(
            f"memory_mb must be between {limits.MIN_MEMORY_MB} and {limits.MAX_MEMORY_MB}, "
            f"got {memory_mb}"
        )
    return memory_mb


def validate_disk(disk_mb: object) -> int:
    if isinstance(disk_mb, bool) or not isinstance(disk_mb, int):
        raise InputValidationError(f"disk_mb must be an integer, got {disk_mb!r}")
    if not limits.MIN_DISK_MB <= disk_mb <= limits.MAX_DISK_MB:
        raise InputValidationError(
            f"disk_mb must be between {limits.MIN_DISK_MB} and {limits.MAX_DISK_MB}, got {disk_mb}"
        )
    return disk_mb


def validate_vcpus(vcpus: object) -> int:
    if isinstance(vcpus, bool) or not isinstance(vcpus, int):
        raise InputValidationError(f"vcpus must be an integer, got {vcpus!r}")
    if not limits.MIN_VCPUS <= vcpus <= limits.MAX_VCPUS:
        raise InputValidationError(
            f"vcpus must be between {limits.MIN_VCPUS} and {limits.MAX_VCPUS}, got {vcpus}"
        )
    return vcpus


# A template's name: what `sbx template` lists and a file name in the template cache.
TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def validate_template_name(name: object) -> str:
    if not isinstance(name, str) or not TEMPLATE_NAME.fullmatch(name) or ".." in name:
        raise InputValidationError(
            f"a template name is 1-63 of a-z, 0-9, '.', '_', '-' (starting with a letter or "
            f"digit), got {name!r}"
        )
    return name


def validate_env(env_vars: Mapping[str, str] | None) -> list[tuple[bytes, bytes]]:
    """Return the variables as (name, value) byte pairs, or raise EnvVarValidationError."""
    if env_vars is None:
        return []
    if not isinstance(env_vars, Mapping):
        raise EnvVarValidationError(f"env_vars must be a mapping, got {type(env_vars).__name__}")
    if len(env_vars) > limits.MAX_ENV_VARS:
        raise EnvVarValidationError(
            f"{len(env_vars)} environment variables, more than the limit of {limits.MAX_ENV_VARS}"
        )
    pairs = []
    for name, value in env_vars.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise EnvVarValidationError(f"invalid environment variable name {name!r}")
        if len(name) > limits.ENV_NAME_MAX_BYTES:
            raise EnvVarValidationError(f"environment variable name {name[:32]!r}... is too long")
        upper = name.upper()
        if upper in _DENIED_ENV or upper.startswith("LD_"):
            raise EnvVarValidationError(
                f"environment variable {name!r} is not allowed: it changes how programs load code"
            )
        if not isinstance(value, str):
            raise EnvVarValidationError(
                f"value of {name!r} must be a str, got {type(value).__name__}"
            )
        if _ENV_VALUE_BAD.search(value):
            raise EnvVarValidationError(f"value of {name!r} contains a control character")
        try:
            # Strict: "surrogatepass" turned a lone surrogate into bytes that are not UTF-8,
            # which the guest then saw as something other than what the caller passed.
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:
            raise EnvVarValidationError(
                f"value of {name!r} is not valid Unicode text (it holds a lone surrogate)"
            ) from None
        if len(encoded) > limits.ENV_VALUE_MAX_BYTES:
            raise EnvVarValidationError(
                f"value of {name!r} is {len(encoded)} bytes, more than {limits.ENV_VALUE_MAX_BYTES}"
            )
        pairs.append((name.encode(), encoded))
    return pairs
