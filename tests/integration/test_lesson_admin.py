"""Lessons started like a person would (#28 item 7) and board status kept (item 6), end to
end: a real broker, the composed gateway, the board simulator; the admin HTTP API and the
``snlpgw lesson`` CLI against it."""

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
from gateway.tasks.core import RuntimeState
from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import APP, LESSON, TASK, LessonRig, lesson_rig

pytestmark = pytest.mark.integration

# Long enough that a lesson is still running when the test pauses, resumes and stops it.
SLOW = (5_000, 5_000, 5_000, 5_000)


async def post(rig: LessonRig, path: str, body: Any = None) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{rig.gw.service.admin.port}{path}"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        return resp.status, await resp.json()


def lesson_path(rig: LessonRig, action: str, dev: str | None = None) -> str:
    return f"/admin/devices/{dev or rig.dev}/lesson/{action}"


def start_body(priority: int = 3, **extra: Any) -> dict[str, Any]:
    return {"app_id": APP, "task_id": TASK, "lesson_id": LESSON, "priority": priority, **extra}


async def test_start_pause_resume_stop_over_http(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path, durations_ms=SLOW) as rig:
        status, answer = await post(rig, lesson_path(rig, "start"), start_body())
        assert status == 200, answer
        assert answer["status"] == "accepted"
        assert answer["action"] == "start"
        instance = answer["instance_id"]
        assert instance
        # The same reply went out on the device's reply topic (the control topic's path).
        await rig.watch.until(
            lambda: next((r for r in rig.replies if r.body["ref"] == answer["request_id"]), None),
            "the admin request's reply on the reply topic",
        )
        await rig.wait_command("PLAY_MEDIA")

        status, answer = await post(rig, lesson_path(rig, "pause"))
        assert (status, answer["status"], answer["instance_id"]) == (200, "accepted", instance)
        runtime = rig.runtime()
        assert runtime is not None
        assert runtime.state is RuntimeState.PAUSED

        status, answer = await post(rig, lesson_path(rig, "resume"))
        assert (status, answer["status"]) == (200, "accepted"), answer
        runtime = rig.runtime()
        assert runtime is not None
        assert runtime.state is not RuntimeState.PAUSED

        # pause/resume/stop may name the instance: another one is refused no_instance
        status, answer = await post(rig, lesson_path(rig, "stop") + "?instance_id=other-1")
        assert (status, answer["status"], answer["reason"]) == (200, "refused", "no_instance")
        status, answer = await post(rig, lesson_path(rig, "stop") + f"?instance_id={instance}")
        assert (status, answer["status"]) == (200, "accepted"), answer
        await rig.wait_event("instance.cancelled", instance_id=instance)


async def test_http_start_keeps_priorities_and_admission(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path, durations_ms=SLOW) as rig:
        running = await rig.start(priority=3)  # a parent's lesson over MQTT
        assert running["status"] == "accepted"
        status, answer = await post(rig, lesson_path(rig, "start"), start_body(priority=1))
        assert (status, answer["status"], answer["reason"]) == (200, "refused", "busy")
        assert answer["running_priority"] == 3
        status, answer = await post(
            rig, lesson_path(rig, "start"), {"app_id": APP, "task_id": "nope"}
        )
        assert (status, answer["status"], answer["reason"]) == (200, "refused", "unknown_task")
        # a higher priority preempts the running lesson, as on the control topic
        status, answer = await post(rig, lesson_path(rig, "start"), start_body(priority=3))
        assert (status, answer["status"]) == (200, "accepted"), answer
        await rig.wait_event("instance.cancelled", instance_id=running["instance_id"])


async def test_bad_requests_are_refused_clearly(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        status, answer = await post(rig, "/admin/devices/not-a-device/lesson/start", start_body())
        assert (status, answer["error"]) == (400, "bad_request")
        status, answer = await post(rig, lesson_path(rig, "start"), {"app_id": APP})
        assert (status, answer["error"]) == (400, "bad_request")
        assert "task_id" in answer["detail"]
        status, answer = await post(rig, lesson_path(rig, "start"), start_body(priority=7))
        assert (status, answer["error"]) == (400, "bad_request")
        status, answer = await post(rig, lesson_path(rig, "pause") + "?instance_id=..%2F")
        assert (status, answer["error"]) == (400, "bad_request")
        # nothing to pause: the runtime's own refusal
        status, answer = await post(rig, lesson_path(rig, "pause"))
        assert (status, answer["status"], answer["reason"]) == (200, "refused", "no_instance")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()


async def test_cli_lesson_start_and_stop(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path, durations_ms=SLOW) as rig:
        url = f"http://127.0.0.1:{rig.gw.service.admin.port}"
        lesson = f"{APP}/{TASK}/{LESSON}"
        code, out, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "start", rig.dev, lesson
        )
        assert code == 0, (out, err)
        reply = json.loads(out)
        assert reply["status"] == "accepted"
        assert "课程已开始 / lesson started" in err
        await rig.wait_command("PLAY_MEDIA")

        code, out, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "start", rig.dev, lesson, "--priority", "1"
        )
        assert code == 1
        assert json.loads(out)["reason"] == "busy"
        assert "请求被拒绝 / refused: busy" in err

        code, out, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "stop", rig.dev
        )
        assert code == 0, (out, err)
        await rig.wait_event("instance.cancelled", instance_id=reply["instance_id"])

        code, _, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", url, "start", rig.dev, "just-a-name"
        )
        assert code == 2
        assert "APP/TASK[/LESSON]" in err
        code, _, err = await asyncio.to_thread(
            run_cli, "lesson", "--admin-url", "http://127.0.0.1:1", "pause", rig.dev
        )
        assert code == 2
        assert "无法连接网关" in err


async def test_board_status_kept_from_heartbeats(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        # The simulator sends its first heartbeat as it connects, before anything it answers
        # to a lesson (one connection, in order): once a clip has played, the channel has it.
        reply = await rig.start()
        await rig.wait_event("step.played", 0, instance_id=reply["instance_id"])
        status, body = await rig.http_get(f"/admin/boards/{rig.dev}/status")
        assert status == 200
        assert body["device"] == rig.dev
        assert body["online"] is True
        assert (body["fw"], body["rssi"], body["heap"], body["sd_free_mb"]) == (
            "sim-1.0",
            -55,
            120_000,
            1024.0,
        )
        assert body["up_ms"] is not None
        assert body["heartbeat_age_s"] >= 0
        status, body = await rig.http_get(f"/admin/boards/{new_device_id()}/status")
        assert (status, body["error"]) == (404, "not_found")
        status, body = await rig.http_get("/admin/boards/nope/status")
        assert (status, body["error"]) == (400, "bad_request")
