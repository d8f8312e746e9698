"""The catalog reloads without a restart (#28 item 5): validated first, swapped atomically,
and a lesson already running keeps the catalog version it started with. A real broker, the
composed gateway and the board simulator."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.cli.main import main as cli_main
from tests.support.broker import Broker
from tests.support.lesson_rig import CLIPS, LESSON, TASK, LessonRig, clip_path, lesson_rig

pytestmark = pytest.mark.integration


async def reload(rig: LessonRig) -> dict[str, Any]:
    url = f"http://127.0.0.1:{rig.gw.service.admin.port}/admin/catalog/reload"
    async with aiohttp.ClientSession() as http, http.post(url) as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


def shorten_lesson(catalog: Path, clips: tuple[str, ...]) -> None:
    """Rewrite the rig's catalog file: the lesson now has only ``clips``."""
    entries = json.loads(catalog.read_text(encoding="utf-8"))
    for entry in entries:
        if entry["task_id"] == TASK:
            (lesson,) = (x for x in entry["lessons"] if x["lesson_id"] == LESSON)
            lesson["clips"] = list(clips)
            lesson["sentences"] = lesson["sentences"][: len(clips)]
            lesson["durations_ms"] = {c: lesson["durations_ms"][c] for c in clips}
            lesson["transcripts"] = {
                k: v for k, v in lesson["transcripts"].items() if k.split(".")[0] + ".mp3" in clips
            }
    catalog.write_text(json.dumps(entries), encoding="utf-8")


def break_catalog(catalog: Path) -> str:
    """Give the first task a mode that does not exist; returns the good text."""
    good = catalog.read_text(encoding="utf-8")
    entries = json.loads(good)
    entries[0]["interaction_mode"] = "DANCE"
    catalog.write_text(json.dumps(entries), encoding="utf-8")
    return good


def played(rig: LessonRig, instance_id: str) -> list[str]:
    return [
        p.body["params"]["name"]
        for p in rig.commands("PLAY_MEDIA")
        if p.body["id"].startswith(instance_id)
    ]


async def test_reload_keeps_running_lessons_on_their_version(
    broker: Broker, tmp_path: Path
) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        catalog = Path(rig.settings.runtime.catalog_path)
        status, before = await rig.http_get("/admin/catalog")
        assert status == 200
        assert before["version"] == 1
        first = await rig.start()
        await rig.wait_command("PLAY_MEDIA")

        shorten_lesson(catalog, CLIPS[:2])
        answer = await reload(rig)
        assert answer["ok"] is True, answer
        assert answer["version"] == 2
        assert answer["digest"] != before["digest"]

        # the lesson started on version 1 plays all four clips of version 1 ...
        await rig.wait_event("instance.completed", instance_id=first["instance_id"])
        assert played(rig, first["instance_id"]) == [clip_path(c) for c in CLIPS]
        # ... and one started after the swap plays version 2's two
        second = await rig.start()
        await rig.wait_event("instance.completed", instance_id=second["instance_id"])
        assert played(rig, second["instance_id"]) == [clip_path(c) for c in CLIPS[:2]]

        status, now = await rig.http_get("/admin/catalog")
        assert (now["version"], now["digest"]) == (2, answer["digest"])
        (task,) = (t for t in now["tasks"] if t["task_id"] == TASK)
        assert task["lessons"] == [LESSON]


async def test_a_bad_catalog_is_refused_and_the_old_one_kept(
    broker: Broker, tmp_path: Path
) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        catalog = Path(rig.settings.runtime.catalog_path)
        good = break_catalog(catalog)
        answer = await reload(rig)
        assert answer["ok"] is False
        assert answer["version"] == 1
        assert [i["path"] for i in answer["issues"]] == ["$[0].interaction_mode"], answer
        # the running catalog is untouched: the lesson still starts with its four clips
        reply = await rig.start()
        await rig.wait_event("instance.completed", instance_id=reply["instance_id"])
        assert played(rig, reply["instance_id"]) == [clip_path(c) for c in CLIPS]

        url = f"http://127.0.0.1:{rig.gw.service.admin.port}"
        code, _, err = await asyncio.to_thread(run_cli, "catalog", "reload", "--admin-url", url)
        assert code == 1
        assert "catalog not reloaded" in err
        await asyncio.to_thread(catalog.write_text, good, encoding="utf-8")
        code, out, err = await asyncio.to_thread(run_cli, "catalog", "reload", "--admin-url", url)
        assert code == 0, (out, err)
        assert json.loads(out)["version"] == 2
        assert "课程目录已更新 / catalog reloaded: version 2" in err


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()
