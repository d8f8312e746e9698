"""Lesson content (#28 item 5): lesson audio over HTTP with ranges, the app manifest, and
lessons synced to a board's SD card with DOWNLOAD (only changed files, SD space checked,
resumed after the board drops mid-file). A real broker, the composed gateway, the board
simulator fetching over real HTTP and writing files."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.cli.main import main as cli_main
from tests.support.broker import Broker
from tests.support.lesson_rig import APP, CLIPS, LESSON, TASK, LessonRig, clip_path, lesson_rig

pytestmark = pytest.mark.integration

CLIP_BYTES = 100_000  # several 16 KiB chunks per file


def make_resources(root: Path) -> dict[str, bytes]:
    """The lesson's four clips as files in a resource directory (the board's path layout)."""
    files = {}
    for clip in CLIPS:
        data = os.urandom(CLIP_BYTES)
        target = root / clip_path(clip).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        files[clip_path(clip)] = data
    return files


@contextlib.asynccontextmanager
async def content_rig(broker: Broker, tmp: Path, **sim: Any) -> Any:
    resources = tmp / "resources"
    files = await asyncio.to_thread(make_resources, resources)
    sd = tmp / "sd"
    options = {"sd_dir": sd, "download_chunk": 16 * 1024, **sim}
    async with lesson_rig(broker, tmp, runtime={"resource_dir": resources}, sim=options) as rig:
        yield rig, files, resources, sd


async def heard_heartbeat(rig: LessonRig) -> None:
    """The simulator sends its first heartbeat as it connects, before anything it answers to
    a lesson: once a clip has played (and the lesson is stopped) the channel has it."""
    reply = await rig.start()
    await rig.wait_event("step.played", 0, instance_id=reply["instance_id"])
    await rig.request("stop", priority=3)


async def admin(rig: LessonRig, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{rig.gw.service.admin.port}{path}"
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as resp:
        return resp.status, await resp.json()


def sync_body(**extra: Any) -> dict[str, Any]:
    return {"app_id": APP, "task_id": TASK, "lesson_id": LESSON, **extra}


def on_sd(sd: Path) -> dict[str, bytes]:
    return {
        "/" + str(p.relative_to(sd)): p.read_bytes()
        for p in sd.rglob("*")
        if p.is_file() and not p.name.endswith(".part")
    }


async def test_audio_over_http_with_ranges_and_the_manifest(broker: Broker, tmp_path: Path) -> None:
    async with content_rig(broker, tmp_path) as (rig, files, _, _):
        base = f"http://127.0.0.1:{rig.gw.service.http.port}"  # the device listener
        url = f"{base}/media/{APP}/{TASK}/{LESSON}/01.mp3"
        data = files[clip_path("01.mp3")]
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as resp:
                assert resp.status == 200
                assert resp.headers["Accept-Ranges"] == "bytes"
                assert await resp.read() == data
            async with http.get(url, headers={"Range": "bytes=1000-1999"}) as resp:
                assert resp.status == 206
                assert resp.headers["Content-Range"] == f"bytes 1000-1999/{CLIP_BYTES}"
                assert await resp.read() == data[1000:2000]
            for bad in (
                f"/media/{APP}/{TASK}/{LESSON}/05.mp3",  # not in the catalog
                f"/media/{APP}/{TASK}/{LESSON}/04.txt",  # a transcript: not served
                f"/media/{APP}/repeater/{LESSON}/01.mp3",  # in the catalog, no file
                f"/media/{APP}/{TASK}/{LESSON}/..%2F..%2F..%2Fcatalog.json",
            ):
                async with http.get(base + bad) as resp:
                    assert resp.status == 404, bad

        status, manifest = await rig.http_get(f"/admin/apps/{APP}/manifest")
        assert status == 200
        assert (manifest["app_id"], manifest["name"]) == (APP, APP)
        assert manifest["default_task"] == TASK  # the app's first task
        assert manifest["catalog_version"] == 1
        tasks = {t["task_id"]: t for t in manifest["tasks"]}
        resources = tasks[TASK]["resources"]
        assert [r["path"] for r in resources] == [clip_path(c) for c in CLIPS]
        for r in resources:
            assert r["sha256"] == hashlib.sha256(files[r["path"]]).hexdigest()
            assert r["size"] == CLIP_BYTES
            assert r["url"].startswith(base + "/media/")
        assert tasks["repeater"]["resources"] == []
        assert tasks["repeater"]["missing"] == [f"/{APP}/repeater/lessons/{LESSON}/01.mp3"]
        status, _ = await rig.http_get("/admin/apps/no_such_app/manifest")
        assert status == 404


async def test_sync_sends_only_changed_files(broker: Broker, tmp_path: Path) -> None:
    async with content_rig(broker, tmp_path) as (rig, files, resources, sd):
        status, job = await admin(rig, "POST", f"/admin/devices/{rig.dev}/lesson/sync", sync_body())
        assert status == 200, job
        assert job["state"] == "done", job
        assert [f["state"] for f in job["files"]] == ["done"] * 4
        assert all(f["bytes"] == CLIP_BYTES for f in job["files"])
        assert await asyncio.to_thread(on_sd, sd) == files
        assert len(rig.commands("DOWNLOAD")) == 4
        assert rig.commands("ENSURE_APP_DIRS")

        # nothing changed: nothing sent
        status, job = await admin(rig, "POST", f"/admin/devices/{rig.dev}/lesson/sync", sync_body())
        assert (job["state"], [f["state"] for f in job["files"]]) == ("done", ["skipped"] * 4)
        assert len(rig.commands("DOWNLOAD")) == 4

        # one clip changed: only it goes
        changed = os.urandom(CLIP_BYTES)
        await asyncio.to_thread((resources / clip_path("03.mp3").lstrip("/")).write_bytes, changed)
        status, job = await admin(rig, "POST", f"/admin/devices/{rig.dev}/lesson/sync", sync_body())
        assert [f["state"] for f in job["files"]] == ["skipped", "skipped", "done", "skipped"]
        downloads = rig.commands("DOWNLOAD")
        assert len(downloads) == 5
        assert downloads[-1].body["params"]["path"] == clip_path("03.mp3")
        assert downloads[-1].body["params"]["sha256"] == hashlib.sha256(changed).hexdigest()
        assert (await asyncio.to_thread(on_sd, sd))[clip_path("03.mp3")] == changed

        status, latest = await rig.http_get(f"/admin/devices/{rig.dev}/lesson/sync")
        assert (status, latest["state"]) == (200, "done")


async def test_sync_resumes_after_the_board_drops_mid_file(broker: Broker, tmp_path: Path) -> None:
    async with content_rig(broker, tmp_path, drop_mid_download=1) as (rig, files, _, sd):
        status, job = await admin(rig, "POST", f"/admin/devices/{rig.dev}/lesson/sync", sync_body())
        assert status == 200
        assert job["state"] == "done", job
        first = job["files"][0]
        assert (first["state"], first["attempts"]) == ("done", 2)  # cut once, then resumed
        assert [f["attempts"] for f in job["files"][1:]] == [1, 1, 1]
        assert rig.board.stats["download_cut"] == 1
        assert rig.board.stats["download_resumed"] == 1  # a Range request answered 206
        assert await asyncio.to_thread(on_sd, sd) == files


async def test_sync_checks_the_sd_free_space(broker: Broker, tmp_path: Path) -> None:
    async with content_rig(broker, tmp_path, sd_free_mb=0.2) as (rig, _, _, sd):
        await heard_heartbeat(rig)
        status, job = await admin(rig, "POST", f"/admin/devices/{rig.dev}/lesson/sync", sync_body())
        assert status == 200
        assert (job["state"], job["reason"]) == ("refused", "sd_full")
        assert job["bytes_needed"] == 4 * CLIP_BYTES
        assert rig.commands("DOWNLOAD") == []
        # a task whose clip has no file on the gateway is refused before anything is sent
        status, job = await admin(
            rig,
            "POST",
            f"/admin/devices/{rig.dev}/lesson/sync",
            {"app_id": APP, "task_id": "repeater"},
        )
        assert (job["state"], job["reason"]) == ("refused", "missing_files:1")
        assert not (await asyncio.to_thread(on_sd, sd))


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()


async def test_cli_lesson_sync(broker: Broker, tmp_path: Path) -> None:
    async with content_rig(broker, tmp_path) as (rig, files, _, sd):
        url = f"http://127.0.0.1:{rig.gw.service.admin.port}"
        lesson = f"{APP}/{TASK}/{LESSON}"
        code, out, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "sync", rig.dev, lesson
        )
        assert code == 0, (out, err)
        assert json.loads(out)["state"] == "done"
        assert "4 downloaded, 0 unchanged" in err
        assert await asyncio.to_thread(on_sd, sd) == files
        code, out, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "sync", "--all", lesson
        )
        # every online board of the (shared) broker gets a job; ours had nothing to fetch
        answer = json.loads(out)
        (ours,) = (j for j in answer["jobs"] if j["device"] == rig.dev)
        assert ours["state"] == "done"
        assert [f["state"] for f in ours["files"]] == ["skipped"] * 4
        assert f"{rig.dev}: done  — 已下载 0 个, 未变 4 个 / 0 downloaded, 4 unchanged" in err
        code, _, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "sync", "--all", rig.dev, lesson
        )
        assert code == 2
        assert "usage" in err


async def test_sync_as_a_control_action(broker: Broker, tmp_path: Path) -> None:
    async with content_rig(broker, tmp_path) as (rig, files, _, sd):
        reply = await rig.request("sync", app_id=APP, task_id=TASK, lesson_id=LESSON)
        assert (reply["status"], reply["action"]) == ("accepted", "sync")
        sync = rig.gw.content_sync
        assert sync is not None
        job = sync.job_of(rig.dev)
        assert job is not None
        async with asyncio.timeout(30):
            await job.finished.wait()
        assert job.state == "done"
        assert await asyncio.to_thread(on_sd, sd) == files
        # a sync needs the task named, like a start: refused as unreadable (no ref)
        body = {"v": 1, "id": "sync-bad", "action": "sync", "app_id": APP}
        await rig.backend.publish(f"snlpgw/v1/ctl/{rig.dev}", json.dumps(body))
        refused = await rig.watch.until(
            lambda: next(
                (r for r in rig.replies if "sync needs" in (r.body.get("detail") or "")), None
            ),
            "the refusal of a sync without a task",
        )
        assert (refused.body["status"], refused.body["reason"]) == ("refused", "invalid")
