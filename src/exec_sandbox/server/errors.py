"""Every failure as the error body of docs/server.md: library exceptions by their stable code
(wire.error_code), the server's own answers (HubError), unreadable requests (bad_request) and
bugs (internal, the traceback in the server's log only)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import wire
from ..errors import SandboxError
from .hub import HubError

log = logging.getLogger(__name__)


def error_of(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(HTTP status, error body) of an exception."""
    if isinstance(exc, HubError):
        return wire.error_status(exc.code), wire.error_body(exc.code, str(exc))
    if isinstance(exc, ProcessLookupError):
        return wire.error_status(wire.NOT_FOUND), wire.error_body(wire.NOT_FOUND, str(exc))
    if isinstance(exc, SandboxError | FileNotFoundError):
        body = wire.exception_body(exc)
        return wire.error_status(body["error"]["code"]), body
    if isinstance(exc, RequestValidationError | ValueError | UnicodeDecodeError):
        return wire.error_status(wire.BAD_REQUEST), wire.error_body(
            wire.BAD_REQUEST, f"unreadable request: {exc}"[:1000]
        )
    log.error("internal error", exc_info=exc)
    return wire.error_status(wire.INTERNAL), wire.error_body(
        wire.INTERNAL, f"{type(exc).__name__} (the server's log has the traceback)"
    )


def install(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        status, body = error_of(exc)
        return JSONResponse(body, status_code=status)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = wire.NOT_FOUND if exc.status_code == 404 else wire.BAD_REQUEST
        return JSONResponse(wire.error_body(code, str(exc.detail)), status_code=exc.status_code)

    app.add_exception_handler(StarletteHTTPException, http_error)
    # Each class by name, so that Starlette answers them in its exception middleware (an
    # Exception handler alone answers from the outermost one, which also re-raises).
    for cls in (
        RequestValidationError,
        HubError,
        SandboxError,
        ProcessLookupError,
        FileNotFoundError,
        ValueError,
    ):
        app.add_exception_handler(cls, handle)
    app.add_exception_handler(Exception, handle)
