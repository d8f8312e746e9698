"""The task HTTP API through the gateway's real aiohttp server on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.service import Service
from gateway.store import (
    InstanceRecord,
    InstanceState,
    StepRecord,
    Store,
    StoredMetric,
    TaskApi,
    build_store_components,
)
from tests.unit.store.helpers import make_context

pytestmark = pytest.mark.integration

VERDICTS = {"passed", "grade", "level", "good", "bad", "retry_count", "score", "threshold"}


def all_keys(doc: object) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in all_keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in all_keys(v)}
    return set()


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Service, str]]:
    ctx = make_context(tmp_path)
    parts = build_store_components(ctx)
    assert parts.reporter is None  # off by default
    service = Service(ctx, parts.components)
    store = parts.store
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(service.admin.run(), name="test.http"),
            tg.create_task(store.run(), name="test.store"),
        ]
        await service.admin.wait_started()
        store.submit_instance(
            InstanceRecord(
                "inst-1",
                device_id="aa_bb_cc",
                app_id="english_learning",
                task_id="shadowing",
                lesson_id="unit01",
                mode="SHADOWING",
                priority=3,
                source="mqtt",
                state=InstanceState.COMPLETED,
                created_ms=100,
                ended_ms=200,
                current_step=1,
            )
        )
        prompt = "/english_learning/shadowing/lessons/unit01/01.mp3"
        store.submit_step(StepRecord("inst-1", 0, clip="01.mp3", prompt_text=prompt))
        store.submit_step(
            StepRecord(
                "inst-1",
                0,
                expected_text="Good morning.",
                asr_text="good morning",
                metrics=(StoredMetric("text_similarity_v0", 1.0),),
                assessed_at=150,
            )
        )
        store.submit_step(StepRecord("inst-1", 1, failure="audio.failed"))
        for n in range(5):
            state = InstanceState.RUNNING if n % 2 else InstanceState.CANCELLED
            store.submit_instance(
                InstanceRecord(f"other-{n}", device_id=f"dev{n % 2}", state=state, created_ms=n)
            )
        await store.flush()
        try:
            yield service, f"http://127.0.0.1:{service.admin.port}"
        finally:
            for task in tasks:
                task.cancel()


async def get(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json()


async def test_instance_with_steps(gateway: tuple[Service, str]) -> None:
    _, base = gateway
    status, body = await get(f"{base}/task/instance/inst-1")
    assert status == 200
    instance = body["instance"]
    assert isinstance(instance, dict)
    assert instance["instance_id"] == "inst-1"
    assert instance["device"] == "aa_bb_cc"
    assert instance["state"] == "completed"
    assert instance["ended_ms"] == 200
    steps = body["steps"]
    assert isinstance(steps, list)
    assert [s["step_index"] for s in steps] == [0, 1]
    first = steps[0]
    assert first["prompt_text"] == "/english_learning/shadowing/lessons/unit01/01.mp3"
    assert first["expected_text"] == "Good morning."
    assert first["asr_text"] == "good morning"
    assert first["metrics"] == [{"method": "text_similarity_v0", "value": 1.0}]
    assert first["assessed_at"] == 150
    assert steps[1]["metrics"] == []
    assert steps[1]["failure"] == "audio.failed"
    assert not all_keys(body) & VERDICTS


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/task/instance/nope", 404, "not_found"),
        ("/task/instance/bad%20id", 400, "bad_request"),
        ("/task/instance/" + "x" * 129, 400, "bad_request"),
        ("/task/instance?limit=0", 400, "bad_request"),
        ("/task/instance?limit=201", 400, "bad_request"),
        ("/task/instance?limit=ten", 400, "bad_request"),
        ("/task/instance?state=passed", 400, "bad_request"),
        ("/task/instance?device=a%2Fb", 400, "bad_request"),
    ],
)
async def test_errors_are_json(
    gateway: tuple[Service, str], path: str, status: int, error: str
) -> None:
    _, base = gateway
    got_status, body = await get(base + path)
    assert (got_status, body["error"]) == (status, error)
    assert isinstance(body["detail"], str)


async def test_listing_filters_newest_first(gateway: tuple[Service, str]) -> None:
    _, base = gateway

    async def ids(query: str) -> list[object]:
        status, body = await get(f"{base}/task/instance{query}")
        assert status == 200
        listed = body["instances"]
        assert isinstance(listed, list)
        return [i["instance_id"] for i in listed]

    assert await ids("") == ["inst-1", "other-4", "other-3", "other-2", "other-1", "other-0"]
    assert await ids("?device=dev1") == ["other-3", "other-1"]
    assert await ids("?state=cancelled&limit=2") == ["other-4", "other-2"]
    assert await ids("?device=dev0&state=running") == []
    assert await ids("?limit=200&unknown=1") == await ids("")


async def test_health_reports_the_store(gateway: tuple[Service, str]) -> None:
    _, base = gateway
    _, body = await get(f"{base}/healthz")  # 503 here: the broker is not run in this test
    assert body["store"] == {"ok": True, "pending": 0}


async def test_unreadable_store_answers_503(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    store = Store(path=tmp_path, metrics=ctx.metrics)  # a directory: SQLite cannot open it
    TaskApi(store=store, admin=ctx.admin)
    service = Service(ctx, [store])
    async with asyncio.TaskGroup() as tg:
        http = tg.create_task(service.admin.run(), name="test.http")
        await service.admin.wait_started()
        base = f"http://127.0.0.1:{service.admin.port}"
        try:
            for path in ("/task/instance/x", "/task/instance"):
                status, body = await get(base + path)
                assert (status, body["error"]) == (503, "store_unavailable")
        finally:
            http.cancel()
