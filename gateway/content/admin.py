"""Lesson sync on the admin listener (bearer token when ``http.admin_token`` is set); the
``snlpgw lesson sync DEVICE|--all APP/TASK[/LESSON]`` CLI calls these.

* ``POST /admin/devices/{dev}/lesson/sync`` ``{"app_id", "task_id", "lesson_id"?}`` — sync the
  lesson (every lesson of the task when ``lesson_id`` is absent) to one board; waits for the
  job unless ``?wait=false``; answers the job (files, progress, state).
* ``GET /admin/devices/{dev}/lesson/sync`` — the board's latest job, with progress.
* ``POST /admin/lessons/sync`` — the same for every online board; answers every job.

409 ``busy`` (another sync of the board runs) / 503 ``overloaded``; a job refused after it
started (``device_offline``, ``sd_full``, ``unknown_lesson``, ``missing_files:N``) is a 200
with ``state: refused`` and the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.content.sync import LessonSync, SyncJob, SyncJobView
from gateway.http import RouteTable
from gateway.openapi import QueryParam, RouteDoc
from gateway.tasks.admin import NameField
from topics.tree import DEVICE_ID_RE

SYNC_WAIT_S = 900.0  # longest an admin request waits for its job(s)


class LessonSyncBody(BaseModel):
    """The lesson to put on the board(s); all lessons of the task when ``lesson_id`` is absent."""

    model_config = ConfigDict(extra="forbid")

    app_id: NameField
    task_id: NameField
    lesson_id: NameField | None = None


class LessonSyncAll(BaseModel):
    """Every online board's job, and the boards whose job could not start (with why)."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[SyncJobView]
    not_started: dict[str, str]


_WAIT = QueryParam(
    "wait", "false: answer at once (follow with GET)", {"type": "boolean", "default": True}
)
_DOCS = {
    "one": RouteDoc(
        summary="Sync a lesson's audio to a board's SD card (DOWNLOAD; only changed files)",
        tag="content",
        query=(_WAIT,),
        body=LessonSyncBody,
        response=SyncJobView,
        errors=(400, 409, 503),
    ),
    "get": RouteDoc(
        summary="A board's latest lesson sync, with per-file progress",
        tag="content",
        response=SyncJobView,
        errors=(400, 404),
    ),
    "all": RouteDoc(
        summary="Sync a lesson's audio to every online board",
        tag="content",
        query=(_WAIT,),
        body=LessonSyncBody,
        response=LessonSyncAll,
        errors=(400,),
    ),
}


class SyncAdmin:
    def __init__(
        self, sync: LessonSync, *, online: Callable[[], list[str]], admin: RouteTable
    ) -> None:
        self._sync = sync
        self._online = online
        admin.add_route("POST", "/admin/devices/{dev}/lesson/sync", self.one, _DOCS["one"])
        admin.add_route("GET", "/admin/devices/{dev}/lesson/sync", self.get, _DOCS["get"])
        admin.add_route("POST", "/admin/lessons/sync", self.all, _DOCS["all"])

    async def one(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not DEVICE_ID_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        body = await _body(request)
        if isinstance(body, str):
            return _error(400, "bad_request", body)
        job = self._sync.start(dev, body.app_id, body.task_id, body.lesson_id)
        if isinstance(job, str):
            status = 409 if job == "busy" else 503
            return _error(status, job, "another sync of this board runs" if status == 409 else job)
        if _wait(request):
            await _finished([job])
        return web.json_response(job.view().model_dump())

    async def get(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not DEVICE_ID_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        job = self._sync.job_of(dev)
        if job is None:
            return _error(404, "not_found", "no sync of this board since the gateway started")
        return web.json_response(job.view().model_dump())

    async def all(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, str):
            return _error(400, "bad_request", body)
        jobs: list[SyncJob] = []
        not_started: dict[str, str] = {}
        for dev in self._online():
            job = self._sync.start(dev, body.app_id, body.task_id, body.lesson_id)
            if isinstance(job, str):
                not_started[dev] = job
            else:
                jobs.append(job)
        if _wait(request):
            await _finished(jobs)
        answer = LessonSyncAll(jobs=[j.view() for j in jobs], not_started=not_started)
        return web.json_response(answer.model_dump())


async def _finished(jobs: list[SyncJob]) -> None:
    try:
        async with asyncio.timeout(SYNC_WAIT_S):
            for job in jobs:
                await job.finished.wait()
    except TimeoutError:
        pass  # answered with the progress so far


def _wait(request: web.Request) -> bool:
    return request.query.get("wait", "true").lower() not in ("false", "0", "no")


async def _body(request: web.Request) -> LessonSyncBody | str:
    try:
        return LessonSyncBody.model_validate_json(await request.read())
    except ValidationError as exc:
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"[:200]


def _error(status: int, error: str, detail: str) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status)
