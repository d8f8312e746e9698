"""The archive's shell where a lesson cannot reach it: the hot-path submit (bounded, counted,
alarmed) and the admin routes' refusals. Real SQLite and files; the archive is not running, so
nothing leaves the queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.archive import AnswerArchive, FileBlobs
from gateway.metrics import Metrics
from gateway.settings import ArchiveSettings
from gateway.store import Store
from tests.unit.store.helpers import sample


def _archive(
    tmp_path: Path, alarms: list[str], metrics: Metrics, **settings: object
) -> AnswerArchive:
    return AnswerArchive(
        settings=ArchiveSettings(**settings),  # type: ignore[arg-type]
        store=Store(path=tmp_path / "gw.sqlite3"),
        blobs=FileBlobs(tmp_path / "audio"),
        metrics=metrics,
        alarm=lambda name, **_: alarms.append(name),
    )


async def test_a_full_queue_drops_the_new_answer_counted_and_alarmed(tmp_path: Path) -> None:
    alarms: list[str] = []
    metrics = Metrics()
    archive = _archive(tmp_path, alarms, metrics, queue_limit=2)
    for step in range(4):
        archive.submit(device="d", instance_id="i", step_index=step, packets=[b"\x18"])
    archive.submit(device="d", instance_id="i", step_index=9, packets=[])
    assert sample(metrics, "archive_dropped_total", reason="queue_full") == 2
    assert sample(metrics, "archive_dropped_total", reason="no_audio") == 1
    assert sample(metrics, "archive_queue_depth") == 2
    assert alarms == ["archive_overflow"]  # rate-limited: one per minute


class ArchiveRoutes:
    """The archive's routes on a bare aiohttp app (the RouteDoc goes nowhere here)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    def add_route(self, method: str, path: str, handler: Any, doc: object = None) -> None:
        self.app.router.add_route(method, path, handler)


async def test_the_admin_routes_refuse_what_they_cannot_serve(tmp_path: Path) -> None:
    app = web.Application()
    archive = AnswerArchive(
        settings=ArchiveSettings(),
        store=Store(path=tmp_path / "gw.sqlite3"),
        blobs=FileBlobs(tmp_path / "audio"),
        admin=ArchiveRoutes(app),
    )
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/admin/audio/links", data=b"{not json")
        assert resp.status == 400
        resp = await client.delete("/admin/records/..%2F..")
        assert resp.status in (400, 404)
        resp = await client.delete("/admin/records/" + "x" * 200)
        assert resp.status == 400
        link = archive.link("ab" * 32)
        resp = await client.get(link.url)  # genuine link, no such answer
        assert resp.status == 404
        resp = await client.get(link.url.replace("expires=", "expires=1"))
        assert resp.status == 403
        assert (await resp.json())["error"] == "bad_signature"
