"""The catalog on the admin listener (bearer token when ``http.admin_token`` is set).

* ``GET  /admin/catalog`` — the version running: ``version`` (1 at start, +1 per reload),
  ``digest`` of the files, task count, files, when it was loaded, and the tasks.
* ``POST /admin/catalog/reload`` — load ``runtime.catalog_path`` again; validated first: when
  it does not load, nothing changes and ``ok`` is false with every problem listed; else the
  new version is swapped in atomically (:mod:`gateway.tasks.catalog_live`; running lessons keep
  the version they started with). ``snlpgw catalog reload`` calls it.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from gateway.http import RouteTable
from gateway.openapi import RouteDoc
from gateway.tasks.catalog_live import CatalogVersion, LiveCatalog
from gateway.tasks.core.loader import CatalogIssue


class CatalogTaskEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app_id: str
    task_id: str
    interaction_mode: str
    lessons: list[str]


class CatalogVersionAnswer(BaseModel):
    """The catalog version running."""

    model_config = ConfigDict(extra="forbid")

    version: int
    digest: str
    task_count: int
    files: list[str]
    loaded_at: float
    tasks: list[CatalogTaskEntry] = []


class CatalogProblem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    path: str
    message: str


class CatalogReloadAnswer(BaseModel):
    """``ok`` false: the catalog on disk did not load and the running one was kept."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    version: int
    digest: str
    task_count: int
    issues: list[CatalogProblem]
    warnings: list[CatalogProblem]


_DOCS = {
    "get": RouteDoc(
        summary="The task catalog version running, with its tasks and lessons",
        tag="catalog",
        response=CatalogVersionAnswer,
    ),
    "reload": RouteDoc(
        summary="Reload the catalog without a restart: validated, then swapped atomically",
        tag="catalog",
        description="Running lessons keep the catalog version they started with; ok=false "
        "(nothing changed) lists every problem of the catalog on disk.",
        response=CatalogReloadAnswer,
    ),
}


def _problems(issues: tuple[CatalogIssue, ...]) -> list[CatalogProblem]:
    return [CatalogProblem(file=i.file, path=i.path, message=i.message) for i in issues[:100]]


class CatalogAdmin:
    def __init__(self, catalog: LiveCatalog, *, admin: RouteTable) -> None:
        self._catalog = catalog
        admin.add_route("GET", "/admin/catalog", self.get, _DOCS["get"])
        admin.add_route("POST", "/admin/catalog/reload", self.reload, _DOCS["reload"])

    async def get(self, _: web.Request) -> web.Response:
        v: CatalogVersion = self._catalog.current
        tasks = [
            CatalogTaskEntry(
                app_id=t.app_id,
                task_id=t.task_id,
                interaction_mode=t.interaction_mode,
                lessons=[lesson.lesson_id for lesson in t.lessons],
            )
            for t in self._catalog
        ]
        answer = CatalogVersionAnswer(
            version=v.version,
            digest=v.digest,
            task_count=v.tasks,
            files=list(v.files),
            loaded_at=v.loaded_at,
            tasks=tasks,
        )
        return web.json_response(answer.model_dump())

    async def reload(self, _: web.Request) -> web.Response:
        outcome = await self._catalog.reload()
        v = outcome.version
        answer = CatalogReloadAnswer(
            ok=outcome.ok,
            version=v.version,
            digest=v.digest,
            task_count=v.tasks,
            issues=_problems(outcome.issues),
            warnings=_problems(outcome.warnings),
        )
        return web.json_response(answer.model_dump())
