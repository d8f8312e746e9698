"""The admin listener's OpenAPI 3.1 document, made from the routes the gateway really serves.

Every component that serves an admin route passes a :class:`RouteDoc` to
``HttpServer.add_route``: a summary, its query parameters, and the pydantic models of its body
and answer. :func:`build_document` turns the admin server's documented routes into the
document; ``python -m gateway.admin_doc --write`` builds the production gateway (nothing is
started or connected) and writes ``docs/openapi/admin.json``. Two tests keep it honest
(``tests/unit/test_openapi.py``): the committed file equals a fresh build, and every route the
admin router holds is documented — a route added without a ``RouteDoc`` fails the suite.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

DOC = Path("docs") / "openapi" / "admin.json"  # relative to the repository root
REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::[^}]*)?\}")


class ErrorBody(BaseModel):
    """Every admin error answer: a stable code to branch on and a sentence for people."""

    model_config = ConfigDict(extra="forbid")

    error: str
    detail: str


@dataclass(frozen=True)
class QueryParam:
    """A query parameter."""

    name: str
    description: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class RouteDoc:
    """What a route takes and answers. ``response``: the 200 body's model (JSON);
    ``content_type``: set for non-JSON answers (``text/csv``, ``audio/ogg``, ``text/html``);
    ``errors``: the error statuses it can answer (body :class:`ErrorBody`); ``bearer``: False
    for a route that authenticates each request itself (a signed link, the console's own
    session) and so is served without the admin bearer token."""

    summary: str
    tag: str
    description: str = ""
    query: tuple[QueryParam, ...] = ()
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    content_type: str = "application/json"
    status: int = 200
    errors: tuple[int, ...] = ()
    bearer: bool = True


_REASONS = {
    400: "Bad request",
    401: "Missing or wrong bearer token",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    413: "Body too large",
    429: "Too many requests",
    503: "Unavailable",
}


def _parameters(path: str, doc: RouteDoc) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(path)
    ]
    for p in doc.query:
        entry: dict[str, Any] = {
            "name": p.name,
            "in": "query",
            "required": p.required,
            "description": p.description,
            "schema": dict(p.schema),
        }
        params.append(entry)
    return params


def _operation(path: str, doc: RouteDoc, op_id: str) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": doc.summary, "tags": [doc.tag]}
    if doc.description:
        op["description"] = doc.description
    params = _parameters(path, doc)
    if params:
        op["parameters"] = params
    if doc.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model=doc.body.__name__)}}
            },
        }
    if doc.response is not None:
        schema: dict[str, Any] = {"$ref": REF.format(model=doc.response.__name__)}
    elif doc.content_type == "application/json":
        schema = {"type": "object"}
    else:
        schema = {"type": "string", "format": "binary"}
    responses: dict[str, Any] = {
        str(doc.status): {"description": "OK", "content": {doc.content_type: {"schema": schema}}}
    }
    error_ref = {"$ref": REF.format(model=ErrorBody.__name__)}
    if not doc.bearer:
        op["security"] = []
    for status in sorted({*doc.errors, 401} if doc.bearer else set(doc.errors)):
        responses[str(status)] = {
            "description": _REASONS.get(status, "Error"),
            "content": {"application/json": {"schema": error_ref}},
        }
    op["responses"] = responses
    return op


def _operation_id(method: str, path: str) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", "_", _PATH_PARAM.sub(r"by_\1", path)).strip("_")
    return f"{method.lower()}_{words}"


def build_document(
    routes: Mapping[tuple[str, str], RouteDoc], *, title: str, version: str
) -> dict[str, Any]:
    """OpenAPI 3.1 for ``routes`` ((method, path) -> doc), paths and schemas sorted."""
    paths: dict[str, dict[str, Any]] = {}
    models: dict[str, type[BaseModel]] = {ErrorBody.__name__: ErrorBody}
    for (method, path), doc in sorted(routes.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        paths.setdefault(path, {})[method.lower()] = _operation(
            path, doc, _operation_id(method, path)
        )
        for model in (doc.body, doc.response):
            if model is not None:
                known = models.setdefault(model.__name__, model)
                if known is not model:
                    raise ValueError(f"two models named {model.__name__} in the admin API")
    _, top = models_json_schema(
        [(m, "serialization") for _, m in sorted(models.items())], ref_template=REF
    )
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "components": {
            "schemas": dict(sorted(top.get("$defs", {}).items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
