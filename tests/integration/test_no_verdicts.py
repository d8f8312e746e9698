"""No field name anywhere is a verdict (SPEC §2.4): table columns, every topic payload, HTTP
responses. (JSON Schemas: tests/unit/topics/test_contract.py; live lesson payloads:
tests/integration/test_lesson_voice.py.)"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.store import InstanceRecord, InstanceState, StepRecord, Store, StoredMetric, TaskApi
from tests.support.verdicts import FORBIDDEN, verdict_keys
from tests.unit.topics.samples import SAMPLES
from topics import encode


def test_the_walker_can_fail() -> None:
    assert verdict_keys({"steps": [{"metrics": [], "Passed": True}]}) == {"Passed"}
    assert "retry_count" in FORBIDDEN


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_topic_payloads_carry_no_verdicts(sample: object) -> None:
    body = json.loads(encode(sample.model))  # type: ignore[attr-defined]
    assert not verdict_keys(body)


async def test_table_columns_and_http_responses_carry_no_verdicts(tmp_path: Path) -> None:
    path = tmp_path / "gw.sqlite3"
    metrics = Metrics()
    store = Store(path=path, metrics=metrics)
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    TaskApi(store=store, admin=http)
    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(store.run(), name="test.store")
        server = tg.create_task(http.run(), name="test.http")
        await http.wait_started()
        store.submit_instance(
            InstanceRecord(
                "i1",
                device_id="aa_bb_cc_dd_ee_02",
                app_id="a",
                task_id="t",
                lesson_id="l",
                mode="SHADOWING",
                priority=3,
                source="test",
                state=InstanceState.COMPLETED,
                created_ms=1,
            )
        )
        store.submit_step(
            StepRecord(
                "i1",
                0,
                prompt_text="/a/t/lessons/l/01.mp3",
                expected_text="Hi.",
                asr_text="hi",
                metrics=(StoredMetric("text_similarity_v0", 1.0),),
            )
        )
        await store.flush()
        base = f"http://127.0.0.1:{http.port}"
        async with aiohttp.ClientSession() as client:
            for url in (
                f"{base}/task/instance/i1",
                f"{base}/task/instance?device=aa_bb_cc_dd_ee_02",
            ):
                async with client.get(url) as resp:
                    assert resp.status == 200
                    body = await resp.json()
                    assert body, url
                    assert not verdict_keys(body), url
        server.cancel()
        runner.cancel()

    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert {"instances", "steps"} <= set(tables)
        for table in tables:
            columns = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            assert columns
            assert not {c for c in columns if c.lower() in FORBIDDEN}, table
