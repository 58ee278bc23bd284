"""The JSON form of the public API, shared by the server (`server/`) and its clients (`remote/`,
clients/typescript/): one codec for every result dataclass, one table of error codes, one
form of run()/session() options. docs/server.md is the reference of what goes over the wire.

The codec is mechanical so that a new field of a result type reaches every client without a
change here: a dataclass is an object of its fields, tuples and lists are arrays, bytes are
`{"base64": "..."}` (the only bytes in results are `Output.data` of non-text types). Decoding
reads the dataclass's own type hints; unknown members are ignored (a newer server), missing
ones take the field's default (an older one).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from . import errors as _errors
from .models import PortMapping
from .network.names import NetworkValidationError
from .network.secrets import Secret
from .processes import ProcessError
from .run_request import RunOptions
from .volumes import Volume, VolumeMount

API_PREFIX = "/v1"
# The header `sbx serve` sets on each request it passes to an app mounted beside its routes (the
# MCP endpoint): the authenticated caller's name. Set by the server, never taken from a client.
PRINCIPAL_HEADER = "x-exec-sandbox-principal"
# Why the server closes a WebSocket before its end (docs/server.md, "Streaming"): the client
# read too slowly for the server's bounded queue ("try again later"), or its token was revoked
# or expired while the socket was open (policy violation).
CLOSE_TOO_SLOW = 1013
CLOSE_TOKEN_INVALID = 1008
_T = TypeVar("_T")


def encode(value: Any) -> Any:
    """value (a result dataclass, or plain data holding them) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def decode(cls: type[_T], data: Any) -> _T:
    """The dataclass cls from what encode() made of one. ValueError for data of another shape
    (a server's answer is checked like any input)."""
    return typing.cast(_T, _decode(cls, data))


def _decode(tp: Any, data: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return data
    if origin is typing.Union or origin is types.UnionType:
        if data is None and type(None) in args:
            return None
        if isinstance(data, Mapping) and set(data) == {"base64"} and bytes in args:
            return _decode(bytes, data)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(arg, data)
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{data!r:.80} is none of {tp}")
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{data!r:.80} is not one of {args}")
        return data
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise ValueError(f"{tp.__name__}: expected an object, got {type(data).__name__}")
        fields = {name: _decode(hint, data[name]) for name, hint in _fields(tp) if name in data}
        return tp(**fields)
    if origin in (list, Sequence) or tp is list:
        return [_decode(args[0] if args else Any, v) for v in _array(data)]
    if origin is tuple:
        item = args[0] if args else Any
        return tuple(_decode(item, v) for v in _array(data))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        value_type = args[1] if args else Any
        return {str(k): _decode(value_type, v) for k, v in data.items()}
    if tp is bytes:
        if not isinstance(data, Mapping) or not isinstance(data.get("base64"), str):
            raise ValueError("expected {'base64': ...}")
        return base64.b64decode(data["base64"], validate=True)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise ValueError(f"expected a number, got {data!r:.80}")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise ValueError(f"expected {tp.__name__}, got {data!r:.80}")
        return data
    raise TypeError(f"no wire form for {tp!r}")


@functools.cache
def _fields(cls: type[Any]) -> tuple[tuple[str, Any], ...]:
    """(name, type) of a dataclass's init fields. Resolving the hints evaluates every
    annotation of the class and its module: once per class, not per decoded answer (it was most
    of a client's time per call outside the HTTP exchange)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def _array(data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise ValueError(f"expected an array, got {type(data).__name__}")
    return data


# --- errors -------------------------------------------------------------------------------

# Every exception a client may get back, by its stable code: the snake_case of the class name
# without "Error" (VmCapacityError -> "vm_capacity"). Subclasses come before their parents, so
# the first match of an exception's class is the most precise code.
_ERROR_CLASSES: tuple[type[Exception], ...] = (
    _errors.VmTimeoutError,
    _errors.VmTransientError,
    _errors.VmCapacityError,
    _errors.VolumeInUseError,
    _errors.PackageBuildError,
    _errors.TransientError,
    _errors.VmConfigError,
    _errors.VmPermanentError,
    _errors.SnapshotError,
    _errors.TemplateBuildError,
    _errors.TemplateError,
    _errors.VolumeError,
    _errors.PermanentError,
    NetworkValidationError,
    _errors.CodeValidationError,
    _errors.EnvVarValidationError,
    _errors.PackageNotAllowedError,
    _errors.InputValidationError,
    _errors.OutputLimitError,
    _errors.SessionClosedError,
    _errors.CommunicationOutcomeUnknownError,
    _errors.GuestAgentError,
    _errors.CommunicationError,
    ProcessError,
    _errors.SandboxError,
)


def _code_of(cls: type[Exception]) -> str:
    name = cls.__name__.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


ERROR_CODES: dict[str, type[Exception]] = {_code_of(c): c for c in _ERROR_CLASSES}

# Codes of the server itself (no library exception behind them). The remote client raises
# these as the library class given here, so callers catch what they would catch in-process.
NOT_FOUND = "not_found"  # no such session, snapshot, process, template, volume (or not yours)
UNAUTHORIZED = "unauthorized"  # no token, an unknown or expired one
FORBIDDEN = "forbidden"  # the token's scope does not allow the call
LIMIT_EXCEEDED = "limit_exceeded"  # the token's own limit of sessions or VMs
BAD_REQUEST = "bad_request"  # a body or query the server cannot read
INTERNAL = "internal"  # a bug: the server's log has the traceback
# read_file()/list_files() of a path the guest does not have: FileNotFoundError in-process too.
FILE_NOT_FOUND = "file_not_found"
SERVER_CODES: dict[str, type[Exception]] = {
    NOT_FOUND: _errors.SessionClosedError,
    FILE_NOT_FOUND: FileNotFoundError,
    UNAUTHORIZED: _errors.PermanentError,
    FORBIDDEN: _errors.PermanentError,
    LIMIT_EXCEEDED: _errors.VmCapacityError,
    BAD_REQUEST: _errors.InputValidationError,
    INTERNAL: _errors.SandboxError,
}

# The HTTP status of a library error, by the first base class in this list it has.
_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (_errors.InputValidationError, 400),
    (_errors.VmCapacityError, 503),
    (_errors.VolumeInUseError, 409),
    (_errors.SessionClosedError, 409),
    (_errors.VmConfigError, 400),
    (_errors.TemplateBuildError, 422),
    (_errors.OutputLimitError, 422),
    (_errors.TemplateError, 404),
    (_errors.VolumeError, 404),
    (_errors.TransientError, 503),
    (_errors.CommunicationError, 502),
    (ProcessError, 409),
)
SERVER_STATUS = {
    NOT_FOUND: 404,
    FILE_NOT_FOUND: 404,
    UNAUTHORIZED: 401,
    FORBIDDEN: 403,
    LIMIT_EXCEEDED: 429,
    BAD_REQUEST: 400,
    INTERNAL: 500,
}


def error_code(exc: BaseException) -> str:
    """The stable code of a library exception (ERROR_CODES), file_not_found for a guest path
    that does not exist."""
    if isinstance(exc, FileNotFoundError):
        return FILE_NOT_FOUND
    for cls in _ERROR_CLASSES:
        if isinstance(exc, cls):
            return _code_of(cls)
    return INTERNAL


def error_status(code: str) -> int:
    """The HTTP status the server answers a code with."""
    if code in SERVER_STATUS:
        return SERVER_STATUS[code]
    cls = ERROR_CODES.get(code)
    for base, status in _STATUS:
        if cls is not None and issubclass(cls, base):
            return status
    return 500


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The JSON body of every error answer (and of a WebSocket's error message)."""
    return {"error": {"code": code, "message": message, "details": encode(details)}}


def exception_body(exc: BaseException) -> dict[str, Any]:
    """error_body() of a library exception, with the attributes its class carries (a failed
    template step's index, exit status and output; the output kept before an output limit)."""
    details: dict[str, Any] = {}
    if isinstance(exc, _errors.TemplateBuildError):
        details = {"step": exc.step, "exit_code": exc.exit_code, "output": exc.output}
    elif isinstance(exc, _errors.OutputLimitError):
        details = {"stdout": exc.stdout, "stderr": exc.stderr}
    return error_body(error_code(exc), str(exc), **details)


def exception_of(body: Any, status: int = 0) -> Exception:
    """The exception a client raises for an error body: the library's class of its code (a
    server code maps to the class in SERVER_CODES), with the server's message."""
    error = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return _errors.SandboxError(f"the server answered {status} without an error body")
    code = str(error.get("code", INTERNAL))
    message = str(error.get("message", ""))
    cls = ERROR_CODES.get(code) or SERVER_CODES.get(code, _errors.SandboxError)
    details = error.get("details")
    details = details if isinstance(details, Mapping) else {}
    exc: Exception
    if cls is _errors.TemplateBuildError:
        exc = _errors.TemplateBuildError(
            message,
            step=_int_or_none(details.get("step")),
            exit_code=_int_or_none(details.get("exit_code")),
            output=str(details.get("output") or ""),
        )
    elif cls is _errors.OutputLimitError:
        exc = _errors.OutputLimitError(
            message, stdout=str(details.get("stdout", "")), stderr=str(details.get("stderr", ""))
        )
    else:
        exc = cls(message)
    exc.code = code  # type: ignore[attr-defined]
    return exc


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- run()/session() options ------------------------------------------------------------

# RunOptions that are host callables: they stay in the caller's process. Output callbacks are
# served by streaming (a WebSocket); tools cannot cross.
CALLBACK_OPTIONS = frozenset({"on_stdout", "on_stderr", "on_boot_log", "tools"})


def options_to_wire(options: RunOptions) -> dict[str, Any]:
    """run()/session() keyword arguments as the JSON body's members (callbacks left out)."""
    body: dict[str, Any] = {}
    for name, value in typing.cast(Mapping[str, Any], options).items():
        if name in CALLBACK_OPTIONS or value is None:
            continue
        if name == "expose_ports":
            value = [p if isinstance(p, int) else encode(p) for p in value]
        elif name == "volumes":
            value = {path: _volume_to_wire(v) for path, v in value.items()}
        else:
            value = encode(value)  # secrets go with their values: the server is the host
        body[name] = value
    return body


def options_from_wire(body: Mapping[str, Any]) -> RunOptions:
    """The keyword arguments of a JSON body (what options_to_wire made); values keep their JSON
    types, which RunRequest.make() validates as it does a caller's. Unknown members are
    refused (a misspelled option must not be ignored), as are callbacks."""
    options: dict[str, Any] = {}
    known = set(RunOptions.__annotations__) - CALLBACK_OPTIONS
    for name, value in body.items():
        if name not in known:
            raise _errors.InputValidationError(f"unknown option {name!r}")
        if name == "expose_ports" and isinstance(value, list):
            value = [v if isinstance(v, int) else _port_from_wire(v) for v in value]
        elif name == "secrets" and isinstance(value, list):
            value = [_secret_from_wire(v) for v in value]
        elif name == "volumes" and isinstance(value, Mapping):
            value = {path: _volume_from_wire(v) for path, v in value.items()}
        options[name] = value
    return typing.cast(RunOptions, options)


def _volume_to_wire(value: Volume | VolumeMount | str) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, Volume):
        return value.name
    return {"volume": value.name, "read_only": value.read_only}


def _volume_from_wire(value: Any) -> Volume | VolumeMount | str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("volume"), str):
        return VolumeMount(value["volume"], read_only=bool(value.get("read_only", False)))
    raise _errors.InputValidationError(
        f"a volume is a name or {{volume, read_only}}: {value!r:.80}"
    )


def _port_from_wire(value: Any) -> PortMapping:
    try:
        return decode(PortMapping, value)
    except (TypeError, ValueError) as exc:
        raise NetworkValidationError(f"expose_ports entry {value!r:.80}: {exc}") from None


def _secret_from_wire(value: Any) -> Secret:
    if not isinstance(value, Mapping):
        raise NetworkValidationError("a secret is an object {name, value, hosts, ...}")
    try:
        return Secret(
            name=value["name"],
            value=value["value"],
            hosts=list(value.get("hosts", ())),
            headers=None if value.get("headers") is None else list(value["headers"]),
            replace_in_body=value.get("replace_in_body"),
        )
    except (KeyError, TypeError) as exc:
        raise NetworkValidationError(f"a secret needs name, value and hosts ({exc})") from None
