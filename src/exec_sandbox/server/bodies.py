"""The request bodies of docs/server.md as the arguments of library calls: read (bounded),
checked, and converted by exec_sandbox.wire. The REST routes (app.py) and the WebSockets
(streams.py) share them, so a body means the same on both."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from .. import wire
from ..errors import InputValidationError
from .hub import HubError, run_options
from .tokens import Principal

# A JSON body: code (1 MB) escaped, with options, fits well within this.
MAX_JSON_BYTES = 8 << 20
_EXEC_MEMBERS = frozenset({"code", "timeout_seconds", "env_vars"})


def principal(request: Request) -> Principal:
    """The caller (auth.py put it there; a route without it is a wiring bug)."""
    found = getattr(request.state, "principal", None)
    if not isinstance(found, Principal):
        raise HubError(wire.UNAUTHORIZED, "no principal for this request")
    return found


def require_admin(who: Principal) -> None:
    if not who.admin:
        raise HubError(wire.FORBIDDEN, f"token {who.name!r} has scope run; this call needs admin")


async def read_json(request: Request) -> Any:
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_JSON_BYTES:
            raise HubError(wire.BAD_REQUEST, f"the body is larger than {MAX_JSON_BYTES} bytes")
    if not data.strip():
        return {}
    try:
        return json.loads(data)
    except ValueError as exc:
        raise HubError(wire.BAD_REQUEST, f"the body is not JSON: {exc}") from None


def exec_arguments(body: Any) -> tuple[str, dict[str, Any]]:
    """(code, keyword arguments of Session.exec) of an exec body."""
    if not isinstance(body, dict):
        raise HubError(wire.BAD_REQUEST, "the body must be a JSON object")
    unknown = set(body) - _EXEC_MEMBERS
    if unknown:
        raise InputValidationError(f"unknown member(s) of an exec: {sorted(unknown)}")
    code = body.get("code")
    if not isinstance(code, str):
        raise InputValidationError("code must be a string")
    return code, {k: body[k] for k in ("timeout_seconds", "env_vars") if k in body}


def run_arguments(body: Any) -> tuple[str, Any]:
    """(code, run() options) of a run body."""
    if not isinstance(body, dict):
        raise HubError(wire.BAD_REQUEST, "the body must be a JSON object")
    code = body.get("code")
    if not isinstance(code, str):
        raise InputValidationError("code must be a string")
    return code, run_options(body, exclude=lambda k: k == "code")
