"""The results API over lessons really run: Mosquitto, the gateway, a board simulator, a Xiaozhi
device reading espeak-ng speech into the windows, pocketsphinx in a worker process, SQLite.
Two runs of the same lesson, then history, progress and both exports read back over HTTP; and a
STEPS task (arithmetic within 10) whose behaviour signals the same routes serve."""

from __future__ import annotations

import asyncio
import csv
import io
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.service import Service
from gateway.store import Store
from gateway.store.results_api import ResultsApi
from tests.integration.test_dsl_tasks import (
    ROUNDS,
    arithmetic_child,
    games_catalog,  # noqa: F401  # the fixture (the shipped catalog, arithmetic cut to ROUNDS)
    start_task,
)
from tests.support.broker import Broker
from tests.support.verdicts import verdict_keys
from tests.support.voice_lesson import RATIO, Observed, child, lesson_rig, start
from tests.unit.store.helpers import make_context

SIM = "metric:text_similarity_v0"


async def _get(gw: Gateway, path: str) -> tuple[int, str, Any]:
    url = f"http://127.0.0.1:{gw.service.admin.port}{path}"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
        body = await resp.json(content_type=None) if resp.content_type.endswith("json") else None
        return resp.status, resp.content_type, body if body is not None else text


async def _run(device: Any, seen: Observed, backend: Any, dev: str, script: dict[int, str | None], *,
               assessed: int, **params: Any) -> str:  # fmt: skip
    for kept in (seen.events, seen.replies, seen.assessments):
        kept.clear()
    async with asyncio.TaskGroup() as tg:
        reader = tg.create_task(child(device, seen, script), name="test.child")
        instance_id = await start(backend, dev, seen, params={"listen_ratio": RATIO, **params})
        await seen.until(lambda: bool(seen.named("instance.completed")), 60)
        await reader
    await seen.until(lambda: len(seen.assessments) >= assessed, 60)
    return instance_id


async def test_history_progress_and_exports_of_real_lessons(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    async with lesson_rig(broker, tmp_path, device_id, PocketsphinxEngine) as (
        gw,
        seen,
        device,
        backend,
    ):
        script = {0: "Good morning.", 1: "I like green apples.", 2: None, 3: None}
        first = await _run(device, seen, backend, device_id, script, assessed=2)
        second = await _run(
            device, seen, backend, device_id, {2: "I am fine, thank you.", 3: None}, assessed=1,
            start_step=2,
        )  # fmt: skip
        await gw.store.flush()
        base = f"/results/devices/{device_id}"

        status, ctype, history = await _get(gw, f"{base}/history")
        assert (status, ctype) == (200, "application/json")
        assert history["device"] == device_id
        assert history["truncated"] is False
        assert [i["instance_id"] for i in history["instances"]] == [second, first]
        runs = {i["instance_id"]: i for i in history["instances"]}
        assert all(r["lesson_id"] == "unit01" and r["state"] == "completed" for r in runs.values())
        steps = {s["step_index"]: s for s in runs[first]["steps"]}
        assert steps[0]["expected_text"] == "Good morning."
        assert steps[0]["prompt_text"].endswith("/unit01/01.mp3")
        assert steps[0]["asr_text"]
        (m0,) = steps[0]["metrics"]
        (m1,) = steps[1]["metrics"]
        assert m0["value"] >= 0.8
        assert m1["value"] <= 0.5
        assert steps[0]["audio_id"]  # the answer is archived; its link is signed, short-lived
        assert steps[0]["reassessments"] == []
        # a shadowing lesson is clip-stepped: no behaviour signals, null rather than zeros
        assert runs[first]["signals"] is None
        assert (steps[0]["response_latency_ms"], steps[0]["step_completed"]) == (None, None)
        assert steps[2]["audio_id"] is None  # silence: nothing kept
        assert steps[2]["audio_url"] is None
        async with aiohttp.ClientSession() as http:
            admin = f"http://127.0.0.1:{gw.service.admin.port}"
            async with http.get(admin + steps[0]["audio_url"]) as resp:
                assert (resp.status, resp.content_type) == (200, "audio/ogg")
                assert (await resp.read())[:4] == b"OggS"
        later = {s["step_index"]: s for s in runs[second]["steps"]}
        assert later[2]["expected_text"] == "I am fine, thank you."
        assert later[2]["metrics"][0]["value"] >= 0.8
        assert later[3]["asr_text"] is None  # silent: nothing assessed
        assert later[3]["metrics"] == []

        status, _, progress = await _get(gw, f"{base}/progress")
        assert status == 200
        (lesson,) = progress["lessons"]
        assert lesson["lesson_id"] == "unit01"
        assert [p["instance_id"] for p in lesson["points"]] == [first, second]  # oldest first
        p1, p2 = lesson["points"]
        assert p1["steps_assessed"] == 2
        assert p2["steps_assessed"] == 1
        assert p1["metrics"][0]["mean"] == (m0["value"] + m1["value"]) / 2
        assert p1["metrics"][0]["count"] == 2
        assert p1["signals"] is None

        status, _, exported = await _get(gw, f"{base}/export.json")
        assert status == 200
        assert exported["columns"][-1] == SIM
        rows = exported["rows"]
        assert [(r["instance_id"], r["step_index"]) for r in rows] == [
            (second, 2), (second, 3), (first, 0), (first, 1), (first, 2), (first, 3),
        ]  # fmt: skip
        assert rows[2][SIM] == m0["value"]
        assert rows[1][SIM] is None

        status, ctype, text = await _get(gw, f"{base}/export.csv")
        assert (status, ctype) == (200, "text/csv")
        parsed = list(csv.DictReader(io.StringIO(text)))
        assert list(parsed[0]) == exported["columns"]
        for got, want in zip(parsed, rows, strict=True):
            for column in exported["columns"]:
                value = want[column]
                assert got[column] == ("" if value is None else str(value)), column

        window = f"{base}/history?since_ms={runs[second]['created_ms']}"
        status, _, recent = await _get(gw, window)
        assert [i["instance_id"] for i in recent["instances"]] == [second]
        status, _, none = await _get(gw, "/results/devices/nobody/history")
        assert (status, none["instances"]) == (200, [])
        for bad in ("/results/devices/a%20b/history", f"{base}/progress?limit=0",
                    f"{base}/export.csv?since_ms=5&until_ms=5", f"{base}/history?until_ms=-1"):  # fmt: skip
            status, _, err = await _get(gw, bad)
            assert (status, err["error"]) == (400, "bad_request"), bad
        assert not verdict_keys([history, progress, exported])


@pytest.mark.usefixtures("games_catalog")
async def test_behaviour_signals_of_a_steps_task_in_history_progress_and_exports(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    """Arithmetic within 10 run for real (right, wrong, silent, talking over: the child of
    test_dsl_tasks.py); the run's signals derived from its stored steps match the
    ``instance.signals`` event the runtime published at its end."""
    async with lesson_rig(broker, tmp_path, device_id, PocketsphinxEngine) as (
        gw,
        seen,
        device,
        backend,
    ):
        async with asyncio.TaskGroup() as tg:
            instance_id = await start_task(backend, device_id, seen, "arithmetic_10")
            kid = tg.create_task(arithmetic_child(gw, device_id, device, seen), name="test.kid")
            await seen.until(lambda: bool(seen.named("instance.completed")), 180)
            await kid
        await seen.until(lambda: len(seen.assessments) >= ROUNDS, 60)
        (published,) = seen.named("instance.signals")
        await gw.store.flush()
        base = f"/results/devices/{device_id}"

        status, _, history = await _get(gw, f"{base}/history")
        assert status == 200
        (run,) = history["instances"]
        assert run["instance_id"] == instance_id
        steps = {s["step_index"]: s for s in run["steps"]}
        assert set(steps) == set(range(ROUNDS))
        assert [steps[i]["step_completed"] for i in range(ROUNDS)] == [1, 1, 0, 1]
        assert steps[2]["response_latency_ms"] is None  # silent: nothing said
        latencies = [steps[i]["response_latency_ms"] for i in (0, 1, 3)]
        assert all(isinstance(ms, int) and ms >= 0 for ms in latencies)
        signals = run["signals"]
        assert (
            (signals["steps"], signals["responded"], signals["completed"])
            == (
                published["data"]["steps"],
                published["data"]["responded"],
                published["data"]["completed"],
            )
            == (ROUNDS, 3, 3)
        )
        assert signals["mean_latency_ms"] == sum(latencies) / 3
        assert round(signals["mean_latency_ms"]) == published["data"]["mean_latency_ms"]
        assert signals["median_latency_ms"] == sorted(latencies)[1]

        status, _, progress = await _get(gw, f"{base}/progress")
        assert status == 200
        ((point,),) = [lesson["points"] for lesson in progress["lessons"]]
        assert point["signals"] == signals

        status, _, exported = await _get(gw, f"{base}/export.json")
        assert status == 200
        rows = exported["rows"]
        assert [r["step_completed"] for r in rows] == [1, 1, 0, 1]
        assert [r["response_latency_ms"] for r in rows] == [*latencies[:2], None, latencies[2]]
        assert {r["run_responded"] for r in rows} == {3}
        assert {r["run_median_latency_ms"] for r in rows} == {signals["median_latency_ms"]}
        status, _, text = await _get(gw, f"{base}/export.csv")
        parsed = list(csv.DictReader(io.StringIO(text)))
        assert list(parsed[0]) == exported["columns"]
        assert [r["response_latency_ms"] for r in parsed] == [
            str(latencies[0]), str(latencies[1]), "", str(latencies[2]),
        ]  # fmt: skip
        assert parsed[0]["run_mean_latency_ms"] == repr(signals["mean_latency_ms"])
        assert not verdict_keys([history, progress, exported])


async def test_unreadable_store_answers_503(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    store = Store(path=tmp_path, metrics=ctx.metrics)  # a directory: SQLite cannot open it
    ResultsApi(store=store, admin=ctx.admin)
    service = Service(ctx, [store])
    async with asyncio.TaskGroup() as tg:
        http = tg.create_task(service.admin.run(), name="test.http")
        await service.admin.wait_started()
        base = f"http://127.0.0.1:{service.admin.port}/results/devices/d"
        try:
            for path in ("/history", "/progress", "/export.json", "/export.csv"):
                async with aiohttp.ClientSession() as s, s.get(base + path) as resp:
                    body = await resp.json()
                    assert (resp.status, body["error"]) == (503, "store_unavailable")
        finally:
            http.cancel()
