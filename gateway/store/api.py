"""The task HTTP API (read-only, on the admin listener): ``GET /task/instance/{id}`` and
``GET /task/instance``.

Answers are JSON. An unknown id is 404, a malformed id or query is 400, a failing store is
503; every error body is ``{"error": <code>, "detail": <text>}``. Metrics are the list
``[{"method", "value"}]`` as stored; no verdict fields exist to serve.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web

from gateway.http import HttpServer
from gateway.openapi import QueryParam, RouteDoc
from gateway.store.errors import StoreError
from gateway.store.store import Store
from gateway.tasks.core.effects import InstanceState

log = logging.getLogger(__name__)

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
DEFAULT_LIMIT = 50
MAX_LIMIT = 200


def _error(status: int, code: str, detail: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status)


class BadQuery(ValueError):
    pass


def parse_list_query(query: dict[str, str]) -> tuple[str | None, InstanceState | None, int]:
    """``device``, ``state``, ``limit`` from a query string (other keys are ignored)."""
    device = query.get("device")
    if device is not None and not ID_PATTERN.fullmatch(device):
        raise BadQuery("device: expected 1-128 of [A-Za-z0-9_.:-]")
    state = None
    if "state" in query:
        try:
            state = InstanceState(query["state"])
        except ValueError:
            allowed = "|".join(s.value for s in InstanceState)
            raise BadQuery(f"state: expected one of {allowed}") from None
    limit = DEFAULT_LIMIT
    if "limit" in query:
        raw = query["limit"]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
            raise BadQuery(f"limit: expected an integer 1..{MAX_LIMIT}")
        limit = int(raw)
    return device, state, limit


_GET_DOC = RouteDoc(
    summary="One task instance with its steps and stored metrics",
    tag="tasks",
    errors=(400, 404, 503),
)
_LIST_DOC = RouteDoc(
    summary="Task instances, newest first",
    tag="tasks",
    query=(
        QueryParam("device", "only this device's instances"),
        QueryParam(
            "state", "only instances in this state", {"enum": [s.value for s in InstanceState]}
        ),
        QueryParam(
            "limit",
            f"at most this many (1..{MAX_LIMIT})",
            {"type": "integer", "default": DEFAULT_LIMIT},
        ),
    ),
    errors=(400, 503),
)


class TaskApi:
    """Routes only, on the admin listener given at construction (aiohttp runs the handlers)."""

    def __init__(self, *, store: Store, admin: HttpServer) -> None:
        self._store = store
        admin.add_route("GET", "/task/instance/{instance_id}", self.get_instance, _GET_DOC)
        admin.add_route("GET", "/task/instance", self.list_instances, _LIST_DOC)

    async def get_instance(self, request: web.Request) -> web.Response:
        instance_id = request.match_info["instance_id"]
        if not ID_PATTERN.fullmatch(instance_id):
            return _error(400, "bad_request", "instance id: expected 1-128 of [A-Za-z0-9_.:-]")
        try:
            found = await self._store.get_instance(instance_id)
        except StoreError as exc:
            log.warning("task API read failed: %s", exc)
            return _error(503, "store_unavailable", "the store cannot be read")
        if found is None:
            return _error(404, "not_found", f"no instance {instance_id}")
        instance, steps = found
        return web.json_response(
            {"instance": instance.to_json(), "steps": [s.to_json() for s in steps]}
        )

    async def list_instances(self, request: web.Request) -> web.Response:
        try:
            device, state, limit = parse_list_query(dict(request.query))
        except BadQuery as exc:
            return _error(400, "bad_request", str(exc))
        try:
            found = await self._store.list_instances(device_id=device, state=state, limit=limit)
        except StoreError as exc:
            log.warning("task API read failed: %s", exc)
            return _error(503, "store_unavailable", "the store cannot be read")
        return web.json_response({"instances": [i.to_json() for i in found]})
