"""The OpenAPI document of the server (`GET /openapi.json`, checked in as docs/openapi.json).

Routes read and answer JSON through exec_sandbox.wire, not through pydantic models, so the
document's schemas are made here: the result dataclasses' own (pydantic's JSON schema of a
dataclass is its fields, which is exactly wire.encode's form; Output.data's bytes excepted,
documented as {"base64"}), and the request bodies of docs/server.md written out."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from ..models import (
    ExecutionResult,
    FileInfo,
    NetworkConnection,
    PackagesReport,
    SessionSnapshot,
    Template,
)
from ..processes import ProcessInfo
from ..volumes import Volume

_REF = "#/components/schemas/{model}"
_RESULTS: tuple[type, ...] = (
    ExecutionResult,
    FileInfo,
    NetworkConnection,
    PackagesReport,
    SessionSnapshot,
    Template,
    ProcessInfo,
    Volume,
)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(model=name)}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_STR_MAP = {"type": "object", "additionalProperties": _STR}
_STR_LIST = {"type": "array", "items": _STR}
_OPTIONS = {
    "type": "object",
    "description": "run()/session() keyword arguments by their Python names (docs/server.md)",
    "properties": {
        "language": {"enum": ["python", "javascript", "typescript", "ts", "raw"]},
        "packages": _STR_LIST,
        "timeout_seconds": _NUM,
        "memory_mb": _INT,
        "vcpus": _INT,
        "disk_mb": _INT,
        "template": _STR,
        "allow_network": _BOOL,
        "allowed_domains": _STR_LIST,
        "env_vars": _STR_MAP,
        "expose_ports": {
            "type": "array",
            "items": {"anyOf": [_INT, _obj(["internal"], internal=_INT, external=_INT)]},
        },
        "secrets": {
            "type": "array",
            "items": _obj(
                ["name", "value", "hosts"],
                name=_STR,
                value=_STR,
                hosts=_STR_LIST,
                headers=_STR_LIST,
                replace_in_body=_BOOL,
            ),
        },
        "http_headers": {"type": "object", "additionalProperties": _STR_MAP},
        "volumes": {
            "type": "object",
            "additionalProperties": {
                "anyOf": [_STR, _obj(["volume"], volume=_STR, read_only=_BOOL)]
            },
        },
    },
    "additionalProperties": False,
}
_BODIES: dict[str, dict[str, Any]] = {
    "Options": _OPTIONS,
    "RunBody": {"allOf": [_obj(["code"], code=_STR), _ref("Options")]},
    "ExecBody": _obj(["code"], code=_STR, timeout_seconds=_NUM, env_vars=_STR_MAP),
    "InstallBody": _obj(["packages"], packages=_STR_LIST, timeout_seconds=_NUM),
    "ForkBody": _obj([], count={"type": ["integer", "null"]}),
    "SharedWithBody": _obj(["shared_with"], shared_with=_STR_LIST),
    "SpawnBody": _obj(["cmd"], cmd={"anyOf": [_STR, _STR_LIST]}, cwd=_STR, env=_STR_MAP),
    "KillBody": _obj([], signal=_INT),
    "TemplateBody": _obj(
        ["name"], name=_STR, image=_STR, base=_STR, steps={"type": "array", "items": {}}
    ),
    "VolumeBody": _obj(["name"], name=_STR, size_mb=_INT),
    "Health": _obj(["status", "version"], status=_STR, version=_STR),
    "Info": _obj(
        ["principal", "scopes", "accelerator", "version", "limits"],
        principal=_STR,
        scopes=_STR_LIST,
        accelerator=_STR,
        version=_STR,
        limits={"type": "object"},
    ),
    "SessionInfo": _obj(
        ["id", "language", "owner", "shared_with", "exec_count", "closed"],
        id=_STR,
        language=_STR,
        owner=_STR,
        shared_with=_STR_LIST,
        exec_count=_INT,
        closed=_BOOL,
        close_reason=_STR,
        installed=_STR_LIST,
        exposed_ports={"type": "array", "items": _ref("ExposedPort")},
        created_at=_NUM,
    ),
    "Error": _obj(
        ["error"],
        error=_obj(["code", "message"], code=_STR, message=_STR, details={"type": "object"}),
    ),
}
_OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def describe(body: str | None, answer: str | None, *, array: bool = False) -> dict[str, Any]:
    """The keyword arguments of a route decorator that document its body and answer by the
    schema names above ("bytes": raw octets)."""
    extra: dict[str, Any] = {}
    if body == "bytes":
        extra["requestBody"] = {"content": _OCTETS, "required": True}
    elif body is not None:
        extra["requestBody"] = {"content": {"application/json": {"schema": _ref(body)}}}
    error = {"description": "an error", "content": {"application/json": {"schema": _ref("Error")}}}
    responses: dict[int | str, Any] = {"default": error}
    if answer == "bytes":
        responses[200] = {"description": "the bytes", "content": _OCTETS}
    elif answer is not None:
        schema = {"type": "array", "items": _ref(answer)} if array else _ref(answer)
        responses[200] = {
            "description": answer,
            "content": {"application/json": {"schema": schema}},
        }
    return {"openapi_extra": extra, "responses": responses, "response_model": None}


def _result_schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for cls in _RESULTS:
        schema = TypeAdapter(cls).json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[cls.__name__] = schema
    return schemas


def document(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components.update(_result_schemas())
    components.update(_BODIES)
    doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    doc["security"] = [{"bearer": []}]
    return doc


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["describe", "document", "install"]
