"""Lessons started, paused, resumed and stopped like a person would: the admin HTTP API behind
``snlpgw lesson start|pause|resume|stop DEVICE [LESSON]`` (bearer token when
``http.admin_token`` is set).

* ``POST /admin/devices/{dev}/lesson/start`` ``{"app_id", "task_id", "lesson_id"?,
  "priority"?, "params"?}``
* ``POST /admin/devices/{dev}/lesson/pause|resume|stop`` (``?instance_id=`` optional)

Each request is the control request the backend would publish on ``snlpgw/v1/ctl/{dev}``
(source ``admin``, priority parent unless given) put in the same task inbox, so it goes the same
way: the admission line, priorities (a lower one is refused ``busy``), the device's actor. The
answer is the runtime's reply (also published on the device's reply topic): 200 with
``status`` ``accepted`` or ``refused`` and the reason; 400 for a bad device id or body, 409 for
a device another gateway owns (scale-out), 503 when the gateway cannot take or answer it now.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.http import RouteTable
from gateway.openapi import QueryParam, RouteDoc
from gateway.tasks.core import ControlAction, ControlReply, ControlRequest, PriorityLevel
from topics.tree import DEVICE_ID_RE

_NAME = r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,63}$"
NameField = Annotated[str, Field(pattern=_NAME)]
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


class LessonStartBody(BaseModel):
    """Which lesson to start, who asks (1 voice, 2 scheduled, 3 parent) and its start params
    (``listen_ratio``, ``repeat``, ``start_step``: as on the control topic)."""

    model_config = ConfigDict(extra="forbid")

    app_id: NameField
    task_id: NameField
    lesson_id: NameField | None = None
    priority: Literal[1, 2, 3] = 3
    params: dict[str, float | int | str | bool] | None = None


class LessonControlAnswer(BaseModel):
    """The task runtime's reply to the request (the same as on the device's reply topic)."""

    model_config = ConfigDict(extra="forbid")

    device: str
    request_id: str
    action: Literal["start", "pause", "resume", "stop"]
    status: Literal["accepted", "refused"]
    instance_id: str | None = None
    reason: str | None = None
    running_priority: int | None = None
    detail: str | None = None


_INSTANCE = QueryParam("instance_id", "act only if this instance is the device's current one")
_ERRORS = (400, 409, 503)


def _doc(action: str, summary: str) -> RouteDoc:
    return RouteDoc(
        summary=summary,
        tag="lessons",
        description=f"The control request `{action}` through the task inbox (admission, "
        "priorities) as on `snlpgw/v1/ctl/{dev}`; answered with the runtime's reply.",
        query=() if action == "start" else (_INSTANCE,),
        body=LessonStartBody if action == "start" else None,
        response=LessonControlAnswer,
        errors=_ERRORS,
    )


_DOCS = {
    "start": _doc("start", "Start a lesson on a device (as a parent would)"),
    "pause": _doc("pause", "Pause the device's running lesson"),
    "resume": _doc("resume", "Resume the device's paused lesson"),
    "stop": _doc("stop", "Stop the device's lesson"),
}

Control = Callable[[str, ControlRequest], Awaitable[ControlReply | None]]


class LessonAdmin:
    """Routes only; ``control`` is :meth:`TaskService.control`, ``owns`` its ownership test."""

    def __init__(
        self,
        *,
        control: Control,
        owns: Callable[[str], bool],
        admin: RouteTable,
        reply_timeout_s: float,
    ) -> None:
        self._control = control
        self._owns = owns
        self._timeout_s = reply_timeout_s
        for action in ("start", "pause", "resume", "stop"):
            admin.add_route(
                "POST",
                f"/admin/devices/{{dev}}/lesson/{action}",
                self._handler(action),
                _DOCS[action],
            )

    def _handler(self, action: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return await self.handle(action, request)

        return handle

    async def handle(self, action: str, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not DEVICE_ID_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        fields = await _fields(action, request)
        if isinstance(fields, str):
            return _error(400, "bad_request", fields)
        if not self._owns(dev):
            return _error(409, "not_owner", "another gateway owns this device: ask it")
        rid = f"admin-{uuid.uuid4().hex[:16]}"
        req = ControlRequest(action=ControlAction(action), request_id=rid, source="admin", **fields)
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await self._control(dev, req)
        except TimeoutError:
            return _error(503, "no_reply", f"no reply within {self._timeout_s:g} s")
        if reply is None:
            return _error(503, "overloaded", "the gateway cannot take the request now: retry")
        answer = LessonControlAnswer(
            device=dev,
            request_id=rid,
            action=action,
            status="accepted" if reply.accepted else "refused",
            instance_id=reply.instance_id,
            reason=None if reply.accepted or reply.reason is None else reply.reason.value,
            running_priority=reply.running_priority,
            detail=reply.detail,
        )
        return web.json_response(answer.model_dump())


async def _fields(action: str, request: web.Request) -> dict[str, Any] | str:
    """The request's fields for a :class:`ControlRequest`, or what is wrong with it."""
    if action != "start":
        instance_id = request.query.get("instance_id")
        if instance_id is not None and not _ID.fullmatch(instance_id):
            return "instance_id: 1-64 of [A-Za-z0-9_.:-]"
        return {"instance_id": instance_id, "priority": PriorityLevel.PARENT}
    try:
        body = LessonStartBody.model_validate_json(await request.read())
    except ValidationError as exc:
        return _first_error(exc)
    return {
        "app_id": body.app_id,
        "task_id": body.task_id,
        "lesson_id": body.lesson_id,
        "priority": body.priority,
        "params": dict(body.params or {}),
    }


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"[:200]


def _error(status: int, error: str, detail: str) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status)
