"""The steps of a template build (Run, Copy, Env, Workdir, User) and the Sandboxfile parser that
makes them from a Dockerfile-like text.

Every step is validated when it is made, so a bad step fails in the caller's code, before any VM
starts. `plan()` is the step as the build script reads it in plan.json (a Copy's files travel
separately, in the source disk's copy/<step index>/).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import limits
from ..errors import EnvVarValidationError, InputValidationError

# Bounds on what a caller hands the builder: a command is a shell line, not a payload.
COMMAND_MAX_BYTES = 64 * 1024
PATH_MAX_BYTES = 4096
STEPS_MAX = 256
SANDBOXFILE_MAX_BYTES = 1 << 20

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Control characters other than tab and newline (the agent's rule for environment values).
_ENV_VALUE_BAD = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Who a step runs as. The builder adds uid 1000 ("user") to every tree; other users of an image
# are not known to the host, so they are not offered.
_USERS = {"root": "root", "0": "root", "user": "user", "1000": "user"}


def _text(value: object, what: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise InputValidationError(f"{what} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise InputValidationError(f"{what} contains a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InputValidationError(f"{what} is not valid Unicode text") from None
    if size > max_bytes:
        raise InputValidationError(f"{what} is {size} bytes, more than {max_bytes}")
    return value


def _absolute_path(value: object, what: str) -> str:
    path = _text(value, what, PATH_MAX_BYTES)
    if not path.startswith("/"):
        raise InputValidationError(f"{what} must be an absolute path, got {path!r}")
    if "\n" in path:
        raise InputValidationError(f"{what} contains a newline")
    # ".." is resolved in the guest's tree, where it cannot leave it; normalised here so that
    # the same directory is always written the same way (the build's cache key).
    return posixpath.normpath(path).replace("//", "/")


def _user(value: object) -> str:
    if not isinstance(value, str) or value not in _USERS:
        raise InputValidationError(
            f"a step's user is 'root' (or 0) or 'user' (or 1000), got {value!r}"
        )
    return _USERS[value]


@dataclass(frozen=True)
class Run:
    """Run a shell command (`/bin/sh -c command`) in the tree, as root unless user is given
    ("root" or "user"), with the environment and working directory of the steps before it. A
    non-zero exit fails the build (TemplateBuildError with the step's output)."""

    command: str
    user: str | None = None

    def __post_init__(self) -> None:
        command = _text(self.command, "a Run command", COMMAND_MAX_BYTES)
        if not command.strip():
            raise InputValidationError("a Run command is empty")
        if self.user is not None:
            object.__setattr__(self, "user", _user(self.user))

    def plan(self) -> dict[str, Any]:
        step: dict[str, Any] = {"op": "run", "cmd": self.command}
        if self.user is not None:
            step["user"] = self.user
        return step


@dataclass(frozen=True)
class Copy:
    """Copy a host file or directory into the tree, as a Dockerfile's COPY does: a directory's
    contents go into the directory dest (created as needed); a file is written at dest, or into
    dest under its own name when dest ends with "/" or is a directory of the tree already. Modes
    are kept, files are owned by root; a symlink inside a directory is copied as a symlink,
    never followed (the source itself, when it is a symlink, is followed). Devices, fifos and
    sockets are refused."""

    source: Path
    dest: str
    into: bool  # dest ended with "/": a file goes into it, never at it

    def __init__(self, source: Path | str, dest: str) -> None:
        if not isinstance(source, (str, Path)):
            raise InputValidationError(f"a Copy source must be a path, got {type(source).__name__}")
        path = Path(_text(str(source), "a Copy source", PATH_MAX_BYTES)).expanduser()
        if not (path.is_file() or path.is_dir()):
            raise InputValidationError(
                f"a Copy source must be an existing file or directory, got {str(path)!r}"
            )
        object.__setattr__(self, "source", path.absolute())
        object.__setattr__(self, "dest", _absolute_path(dest, "a Copy destination"))
        object.__setattr__(self, "into", dest.endswith("/"))

    def plan(self) -> dict[str, Any]:
        step: dict[str, Any] = {"op": "copy", "dest": self.dest}
        if self.source.is_file():
            step.update(file=self.source.name, into=self.into)
        return step


@dataclass(frozen=True)
class Env:
    """Set environment variables for the following steps and for the code run in the template:
    `Env(PATH="/opt/bin:/usr/bin", LANG="C.UTF-8")` or `Env({"K": "V"})`."""

    vars: dict[str, str]

    def __init__(self, mapping: Mapping[str, str] | None = None, /, **vars: str) -> None:
        if mapping is not None and not isinstance(mapping, Mapping):
            raise EnvVarValidationError(f"Env takes a mapping, got {type(mapping).__name__}")
        merged = {**(mapping or {}), **vars}
        if not merged:
            raise EnvVarValidationError("an Env step sets no variable")
        if len(merged) > limits.MAX_ENV_VARS:
            raise EnvVarValidationError(
                f"{len(merged)} environment variables, more than the limit of {limits.MAX_ENV_VARS}"
            )
        for name, value in merged.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise EnvVarValidationError(f"invalid environment variable name {name!r}")
            if len(name) > limits.ENV_NAME_MAX_BYTES:
                raise EnvVarValidationError(f"environment variable name {name[:32]!r}... is long")
            if not isinstance(value, str):
                raise EnvVarValidationError(
                    f"value of {name!r} must be a str, got {type(value).__name__}"
                )
            # A newline would end the NAME=VALUE line of the template's sbx/env.
            if _ENV_VALUE_BAD.search(value) or "\n" in value:
                raise EnvVarValidationError(f"value of {name!r} contains a control character")
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise EnvVarValidationError(f"value of {name!r} is not valid Unicode") from None
            if size > limits.ENV_VALUE_MAX_BYTES:
                raise EnvVarValidationError(
                    f"value of {name!r} is {size} bytes, more than {limits.ENV_VALUE_MAX_BYTES}"
                )
        object.__setattr__(self, "vars", merged)

    def plan(self) -> dict[str, Any]:
        return {"op": "env", "vars": dict(self.vars)}


@dataclass(frozen=True)
class Workdir:
    """The working directory of the following steps and of the code run in the template
    (created in the tree if missing)."""

    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _absolute_path(self.path, "a Workdir path"))

    def plan(self) -> dict[str, Any]:
        return {"op": "workdir", "path": self.path}


@dataclass(frozen=True)
class User:
    """Who the following Run steps run as: "root" (the default) or "user" (uid 1000, the user
    code runs as in any case)."""

    name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _user(self.name))

    def plan(self) -> dict[str, Any]:
        return {"op": "user", "name": self.name}


Step = Run | Copy | Env | Workdir | User
STEP_TYPES = (Run, Copy, Env, Workdir, User)


def validate_steps(steps: object) -> tuple[Step, ...]:
    """The steps as a tuple, each one a step object, at most STEPS_MAX."""
    if isinstance(steps, (str, bytes)) or not hasattr(steps, "__iter__"):
        raise InputValidationError("steps must be a list of Run, Copy, Env, Workdir, User")
    result = tuple(steps)
    for index, step in enumerate(result):
        if not isinstance(step, STEP_TYPES):
            raise InputValidationError(
                f"step {index} is a {type(step).__name__}, not a Run, Copy, Env, Workdir or User"
            )
    if len(result) > STEPS_MAX:
        raise InputValidationError(f"{len(result)} steps, more than {STEPS_MAX}")
    return result


# --- the Sandboxfile ---


class _Line:
    """One logical line: its text (continuations joined) and the number of its first line."""

    def __init__(self, number: int, text: str) -> None:
        self.number = number
        self.text = text

    def error(self, message: str) -> InputValidationError:
        return InputValidationError(f"Sandboxfile line {self.number}: {message}")


def _logical_lines(text: str) -> list[_Line]:
    """Comment and blank lines dropped; a line ending in a backslash continues on the next
    (comment lines inside a continuation are skipped, as Docker does)."""
    lines: list[_Line] = []
    pending: _Line | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        continued = stripped.endswith("\\")
        part = stripped[:-1].rstrip() if continued else stripped
        if pending is None:
            pending = _Line(number, part)
        else:
            pending.text = f"{pending.text} {part}" if part else pending.text
        if not continued:
            lines.append(pending)
            pending = None
    if pending is not None:
        raise pending.error("the file ends in a line continuation")
    return lines


def _json_list(line: _Line, rest: str) -> list[str] | None:
    """The JSON form of RUN and COPY (`["a", "b"]`), or None when rest is not one."""
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except ValueError as exc:
        raise line.error(f"not a JSON list of strings: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise line.error("not a JSON list of strings")
    return value


def _words(line: _Line, rest: str) -> list[str]:
    try:
        return shlex.split(rest)
    except ValueError as exc:
        raise line.error(str(exc)) from None


def _parse_env(line: _Line, rest: str) -> Env:
    words = _words(line, rest)
    if not words:
        raise line.error("ENV needs NAME=VALUE (or NAME VALUE)")
    if "=" not in words[0]:
        # The legacy form: ENV NAME the rest of the line is the value.
        name, _, value = rest.partition(" ")
        if not value.strip():
            raise line.error("ENV needs NAME=VALUE (or NAME VALUE)")
        return Env({name: value.strip()})
    variables = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep:
            raise line.error(f"{word!r} is not NAME=VALUE")
        variables[name] = value
    return Env(variables)


def _within(context: Path, relative: str, line: _Line) -> Path:
    if any(c in relative for c in "*?["):
        raise line.error(f"COPY does not expand wildcards: {relative!r}")
    base = context.resolve()
    path = (base / relative).resolve()
    if path != base and not path.is_relative_to(base):
        raise line.error(f"COPY source {relative!r} is outside the build context {str(base)!r}")
    if not (path.is_file() or path.is_dir()):
        raise line.error(f"COPY source {relative!r} does not exist in {str(base)!r}")
    return path


def parse_sandboxfile(text: str, context_dir: Path | str) -> tuple[str | None, list[Step]]:
    """(the FROM image or None, the steps) of a Sandboxfile: Dockerfile syntax for FROM, RUN
    (shell and JSON form), COPY (sources relative to context_dir, which they cannot leave),
    ENV (NAME=VALUE ... and NAME VALUE), WORKDIR, USER; `#` comments and backslash
    continuations. Anything else fails with InputValidationError naming the line."""
    if not isinstance(text, str):
        raise InputValidationError(f"a Sandboxfile is text, got {type(text).__name__}")
    if len(text.encode("utf-8", "surrogatepass")) > SANDBOXFILE_MAX_BYTES:
        raise InputValidationError(f"the Sandboxfile is larger than {SANDBOXFILE_MAX_BYTES} bytes")
    context = Path(context_dir)
    from_: str | None = None
    steps: list[Step] = []
    workdir: str | None = None
    for line in _logical_lines(text):
        directive, _, rest = line.text.partition(" ")
        directive = directive.upper()
        rest = rest.strip()
        try:
            if directive == "FROM":
                if from_ is not None or steps:
                    raise line.error("FROM must come once, before every other directive")
                words = rest.split()
                if len(words) != 1:
                    raise line.error("FROM takes one image (no AS, no --platform)")
                from_ = words[0]
            elif directive == "RUN":
                argv = _json_list(line, rest)
                if argv is not None:
                    if not argv:
                        raise line.error("RUN [] runs nothing")
                    rest = shlex.join(argv)
                if rest.startswith("--"):
                    raise line.error(f"RUN options are not supported: {rest.split()[0]}")
                steps.append(Run(rest))
            elif directive == "COPY":
                argv = _json_list(line, rest)
                words = argv if argv is not None else _words(line, rest)
                if words and words[0].startswith("--"):
                    raise line.error(f"COPY options are not supported: {words[0]}")
                if len(words) < 2:
                    raise line.error("COPY needs a source and a destination")
                dest = words[-1]
                if not dest.startswith("/"):
                    if workdir is None:
                        raise line.error(
                            f"COPY destination {dest!r} is relative and no WORKDIR came before"
                        )
                    dest = posixpath.join(workdir, dest)
                if len(words) > 2 and not dest.endswith("/"):
                    dest += "/"  # several sources: dest is a directory, as Docker requires
                for source in words[:-1]:
                    steps.append(Copy(_within(context, source, line), dest))
            elif directive == "ENV":
                steps.append(_parse_env(line, rest))
            elif directive == "WORKDIR":
                path = rest
                if len(_words(line, rest)) == 1:
                    path = _words(line, rest)[0]
                if not path:
                    raise line.error("WORKDIR needs a path")
                if not path.startswith("/"):
                    if workdir is None:
                        raise line.error(f"WORKDIR {path!r} is relative and no WORKDIR came before")
                    path = posixpath.join(workdir, path)
                step = Workdir(path)
                workdir = step.path
                steps.append(step)
            elif directive == "USER":
                steps.append(User(rest))
            else:
                raise line.error(
                    f"{directive} is not supported (FROM, RUN, COPY, ENV, WORKDIR, USER are)"
                )
        except InputValidationError as exc:
            if str(exc).startswith("Sandboxfile line"):
                raise
            raise line.error(str(exc)) from None
        if len(steps) > STEPS_MAX:
            raise line.error(f"more than {STEPS_MAX} steps")
    return from_, steps
