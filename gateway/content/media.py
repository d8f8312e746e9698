"""Lesson audio over HTTP and the app manifest (device-capability spec §14).

**Audio** — ``GET /media/{app_id}/{task_id}/{lesson_id}/{clip}`` on the **device listener**
(``http.host:port``): boards download from it (the admin listener is loopback and wants a
bearer token a board does not have). Only a clip the running catalog names is served, from
``runtime.resource_dir/{app_id}/{task_id}/lessons/{lesson_id}/{clip}`` (the board's own path
layout, SPEC §5); nothing else of the resource directory (transcripts, other files) and no path
outside it. aiohttp's ``FileResponse`` answers ``Range`` requests (206, ``Accept-Ranges``,
``If-Range``), which is what lets a board resume a download cut mid-file.

**Manifest** — ``GET /admin/apps/{app_id}/manifest`` (admin listener): ``app_id``, ``name``,
``default_task`` and ``tasks[]`` with ``resources[]`` = board ``path``, ``url``, ``sha256``,
``size`` for every clip found, and ``missing[]`` for clips the catalog names without a file.
``name`` and ``default_task`` come from ``resource_dir/{app_id}/app.json`` when present
(``{"name": ..., "default_task": ...}``), else the app id and its first task. Hashes are cached
by (path, size, mtime).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.http import RouteTable
from gateway.openapi import RouteDoc
from gateway.tasks.core import Catalog, LessonDef, TaskDef

log = logging.getLogger(__name__)

HASHES_KEPT = 4_096  # (path, size, mtime) -> sha256 entries cached


class ManifestResource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lesson_id: str
    path: str  # on the board's SD card: /{app}/{task}/lessons/{lesson}/{clip}
    url: str
    sha256: str
    size: int


class ManifestTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    interaction_mode: str
    title: str | None = None
    resources: list[ManifestResource]
    missing: list[str]  # board paths the catalog names that have no file on the gateway


class AppManifest(BaseModel):
    """Device-capability spec §14: what an app is and what its tasks need on the SD card."""

    model_config = ConfigDict(extra="forbid")

    app_id: str
    name: str
    default_task: str
    catalog_version: int
    tasks: list[ManifestTask]


class _AppInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    default_task: str | None = None


_MANIFEST_DOC = RouteDoc(
    summary="An app's manifest (spec §14): its tasks and the audio each needs on a board",
    tag="content",
    response=AppManifest,
    errors=(404,),
)


@dataclass(frozen=True, slots=True)
class Clip:
    task: TaskDef
    lesson: LessonDef
    clip: str

    @property
    def board_path(self) -> str:
        return self.task.board_path(self.lesson, self.clip)

    @property
    def media_path(self) -> str:
        t = self.task
        return f"/media/{t.app_id}/{t.task_id}/{self.lesson.lesson_id}/{self.clip}"


class LessonMedia:
    def __init__(
        self,
        *,
        catalog: Catalog,
        version: Callable[[], int],
        resource_dir: Path,
        base_url: Callable[[], str],
        http: RouteTable,
        admin: RouteTable | None,
    ) -> None:
        self._catalog = catalog
        self._version = version
        self._base = Path(resource_dir).resolve()
        self._base_url = base_url
        self._hashes: OrderedDict[tuple[str, int, int], str] = OrderedDict()
        self._hash_lock = threading.Lock()  # hashed from worker threads
        http.add_route("GET", "/media/{app_id}/{task_id}/{lesson_id}/{clip}", self.serve)
        if admin is not None:
            admin.add_route("GET", "/admin/apps/{app_id}/manifest", self.manifest, _MANIFEST_DOC)

    # -- lookups --------------------------------------------------------------------------------

    def clips(
        self, app_id: str, task_id: str | None = None, lesson_id: str | None = None
    ) -> Iterator[Clip]:
        """The catalog's clips of an app (one task / lesson when named), in catalog order."""
        for task in self._catalog:
            if task.app_id != app_id or (task_id is not None and task.task_id != task_id):
                continue
            for lesson in task.lessons:
                if lesson_id is None or lesson.lesson_id == lesson_id:
                    for clip in lesson.clips:
                        yield Clip(task, lesson, clip)

    def file_of(self, clip: Clip) -> Path | None:
        """The clip's file under the resource directory, or None (missing, or outside it)."""
        target = (self._base / clip.board_path.lstrip("/")).resolve()
        if not target.is_relative_to(self._base) or not target.is_file():
            return None
        return target

    def url_of(self, clip: Clip) -> str:
        return self._base_url() + clip.media_path

    def sha256_of(self, path: Path) -> tuple[str, int]:
        """(sha256 hex, size) of a file; cached by (path, size, mtime). Blocking: a thread."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._hash_lock:
            cached = self._hashes.get(key)
        if cached is None:
            h = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            cached = h.hexdigest()
            with self._hash_lock:
                self._hashes[key] = cached
                while len(self._hashes) > HASHES_KEPT:
                    self._hashes.popitem(last=False)
        return cached, st.st_size

    def build_manifest(self, app_id: str) -> AppManifest | None:
        """Blocking (hashes files): run in a thread."""
        tasks = [t for t in self._catalog if t.app_id == app_id]
        if not tasks:
            return None
        info = _AppInfo()
        try:
            raw = (self._base / app_id / "app.json").read_text(encoding="utf-8")
            info = _AppInfo.model_validate(json.loads(raw))
        except (OSError, ValueError, ValidationError):
            pass
        entries = []
        for task in tasks:
            resources, missing = [], []
            for clip in self.clips(app_id, task.task_id):
                path = self.file_of(clip)
                if path is None:
                    missing.append(clip.board_path)
                    continue
                sha, size = self.sha256_of(path)
                resources.append(
                    ManifestResource(
                        lesson_id=clip.lesson.lesson_id,
                        path=clip.board_path,
                        url=self.url_of(clip),
                        sha256=sha,
                        size=size,
                    )
                )
            entries.append(
                ManifestTask(
                    task_id=task.task_id,
                    interaction_mode=task.interaction_mode,
                    title=task.title,
                    resources=resources,
                    missing=missing,
                )
            )
        ids = [t.task_id for t in tasks]
        default = info.default_task if info.default_task in ids else ids[0]
        return AppManifest(
            app_id=app_id,
            name=info.name or app_id,
            default_task=default or ids[0],
            catalog_version=self._version(),
            tasks=entries,
        )

    # -- routes ---------------------------------------------------------------------------------

    async def serve(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        wanted = (m["task_id"], m["lesson_id"], m["clip"])
        clip = next(
            (
                c
                for c in self.clips(m["app_id"], m["task_id"], m["lesson_id"])
                if (c.task.task_id, c.lesson.lesson_id, c.clip) == wanted
            ),
            None,
        )
        path = self.file_of(clip) if clip is not None else None
        if path is None:
            return web.json_response(
                {"error": "not_found", "detail": "no such clip in the catalog"}, status=404
            )
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    async def manifest(self, request: web.Request) -> web.Response:
        app_id = request.match_info["app_id"]
        manifest = await asyncio.to_thread(self.build_manifest, app_id)
        if manifest is None:
            return web.json_response(
                {"error": "not_found", "detail": f"no app {app_id} in the catalog"}, status=404
            )
        return web.json_response(manifest.model_dump())
