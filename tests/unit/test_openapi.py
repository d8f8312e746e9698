"""The admin OpenAPI document cannot drift from the routes the gateway serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.admin_doc import admin_document
from gateway.app import build_gateway
from gateway.openapi import DOC, QueryParam, RouteDoc, build_document
from gateway.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_committed_document_is_current() -> None:
    committed = json.loads((ROOT / DOC).read_text(encoding="utf-8"))
    assert committed == admin_document(), "run: .venv/bin/python -m gateway.admin_doc --write"


def test_every_admin_route_is_documented(tmp_path: Path) -> None:
    gw = build_gateway(load_settings(data_dir=tmp_path, asr={"engine": "none"}))
    admin = gw.service.ctx.admin
    undocumented = sorted(set(admin.routes) - set(admin.route_docs))
    assert undocumented == []
    assert ("GET", "/task/instance/{instance_id}") in admin.route_docs


class _Thing(BaseModel):
    name: str


def test_operations_carry_path_and_query_parameters_and_models() -> None:
    doc = build_document(
        {
            ("POST", "/things/{thing}"): RouteDoc(
                summary="make", tag="t", body=_Thing, response=_Thing, errors=(404,)
            ),
            ("GET", "/things"): RouteDoc(
                summary="list",
                tag="t",
                query=(QueryParam("limit", "at most", {"type": "integer"}),),
            ),
            ("GET", "/things/{thing}/audio"): RouteDoc(
                summary="audio", tag="t", content_type="audio/ogg"
            ),
        },
        title="t",
        version="1",
    )
    post = doc["paths"]["/things/{thing}"]["post"]
    assert post["operationId"] == "post_things_by_thing"
    assert post["parameters"] == [
        {"name": "thing", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/_Thing"
    }
    assert set(post["responses"]) == {"200", "401", "404"}
    listed = doc["paths"]["/things"]["get"]
    assert listed["parameters"][0]["in"] == "query"
    audio = doc["paths"]["/things/{thing}/audio"]["get"]["responses"]["200"]["content"]
    assert audio == {"audio/ogg": {"schema": {"type": "string", "format": "binary"}}}
    assert set(doc["components"]["schemas"]) == {"ErrorBody", "_Thing"}


def test_two_models_of_one_name_are_refused() -> None:
    first = type("Same", (BaseModel,), {"__annotations__": {"a": int}})
    second = type("Same", (BaseModel,), {"__annotations__": {"b": int}})
    routes = {
        ("GET", "/a"): RouteDoc(summary="a", tag="t", response=first),
        ("GET", "/b"): RouteDoc(summary="b", tag="t", response=second),
    }
    with pytest.raises(ValueError, match="two models named Same"):
        build_document(routes, title="t", version="1")
