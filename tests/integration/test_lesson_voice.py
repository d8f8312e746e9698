"""A whole shadowing lesson over real components: Mosquitto, the board simulator, a Xiaozhi
device streaming espeak-ng speech over encrypted UDP, libopus, webrtcvad, pocketsphinx in
worker processes, SQLite — the child reads clip 1 right, clip 2 wrong, stays silent on clip 3,
and the ASR engine raises on clip 4. The clock alone steps the lesson; assessments arrive
whenever they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gateway.app import Gateway, build_gateway
from gateway.assessment.procslot import ProcessBackend
from gateway.simulators.board import BoardSimulator, SimOptions
from gateway.simulators.xiaozhi import XiaozhiDeviceSim
from tests.support.asr_engines import RaisingEngine, SlowEngine
from tests.support.broker import Broker
from tests.support.gateway import gateway_settings, running
from tests.support.mqtt_client import ClientSession, mqtt_client
from tests.support.speech import silence, synthesize
from tests.support.verdicts import verdict_keys
from topics import mac_colon

CATALOG = Path(__file__).parents[2] / "catalog"
CLIP_MS = 2000  # every clip "plays" this long on the simulated board
RATIO = 1.5  # window = 1.5 x 2000 ms = 3000 ms
TAIL_MS = 700  # silence after each reading, so the VAD closes the utterance inside the window

# What the child says in each step's window (None: silent).
SCRIPT: dict[int, str | None] = {
    0: "Good morning.",  # right
    1: "I like green apples.",  # wrong ("How are you?")
    2: None,  # silent
    3: "See you later, alligator.",  # right, but the engine raises on it
}


@dataclass
class Observed:
    events: list[dict[str, Any]] = field(default_factory=list)
    assessments: list[dict[str, Any]] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    async def until(self, predicate: Callable[[], bool], wait_s: float) -> None:
        async with asyncio.timeout(wait_s):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


async def _watch(backend: ClientSession, dev: str, seen: Observed) -> None:
    while True:
        msg = await backend.queue.get()
        body = json.loads(msg.payload)
        if msg.topic == f"snlpgw/v1/task/{dev}":
            seen.events.append(body)
        elif msg.topic == f"snlpgw/v1/assessment/{dev}":
            seen.assessments.append(body)
        elif msg.topic == f"snlpgw/v1/reply/{dev}":
            seen.replies.append(body)
        seen.changed.set()


async def _child(device: XiaozhiDeviceSim, seen: Observed, script: dict[int, str | None]) -> None:
    """Reads the script when each window opens (silence streams audio without speech)."""
    done: set[int] = set()
    while len(done) < len(script):
        await seen.until(
            lambda: any(e["step_index"] not in done for e in seen.named("window.opened")), 60
        )
        for opened in seen.named("window.opened"):
            step = opened["step_index"]
            if step in done:
                continue
            done.add(step)
            text = script.get(step)
            pcm = (synthesize(text) if text else silence(1500)) + silence(TAIL_MS)
            await device.stream_pcm(pcm, speed=1.0)


@contextlib.asynccontextmanager
async def lesson_rig(
    broker: Broker, tmp_path: Path, device_id: str, engine: type
) -> AsyncIterator[tuple[Gateway, Observed, XiaozhiDeviceSim, ClientSession]]:
    # The production layout: the gateway's data dir holds the broker files, so OTA provisioning
    # rotates real credentials and reloads the real broker; SQLite is the test's own.
    settings = gateway_settings(
        broker,
        broker.data_dir,
        runtime={"catalog_path": CATALOG, "resource_dir": CATALOG / "resources"},
        asr={"workers": 1},
        store={"sqlite_path": tmp_path / "gateway.sqlite3"},
    )
    gw = build_gateway(settings, asr_backend=ProcessBackend(engine, name=engine.__name__.lower()))
    backend_user = broker.provision(f"be-{device_id[-5:].replace('_', '')}", role="backend")
    seen = Observed()
    async with running(settings, service=gw.service) as svc:
        # One physical board: it provisions over OTA, and both its channels use those credentials.
        device = XiaozhiDeviceSim(mac=mac_colon(device_id))
        info = await device.provision(f"http://127.0.0.1:{svc.http.port}/xiaozhi/ota/")
        board = BoardSimulator(
            device_id,
            host=broker.host,
            port=broker.port,
            username=info.username,
            password=info.password,
            options=SimOptions(default_duration_ms=CLIP_MS, heartbeat_s=5.0),
        )
        async with (
            mqtt_client(broker, backend_user) as backend,
            device,
            asyncio.TaskGroup() as tg,
        ):
            for kind in ("task", "assessment", "reply"):
                await backend.subscribe(f"snlpgw/v1/{kind}/{device_id}")
            tasks = [
                tg.create_task(board.run(), name="test.board-sim"),
                tg.create_task(_watch(backend, device_id, seen), name="test.watch"),
            ]
            await device.open_audio_channel()
            async with asyncio.timeout(10):
                await board.connected.wait()
            try:
                yield gw, seen, device, backend
            finally:
                for task in tasks:
                    task.cancel()


async def _start(backend: ClientSession, dev: str, seen: Observed, **fields: Any) -> str:
    request = {"v": 1, "id": "r1", "action": "start", "app_id": "english_learning",
               "task_id": "shadowing", "lesson_id": "unit01", "priority": 3,
               "params": {"listen_ratio": RATIO}, **fields}  # fmt: skip
    await backend.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(request))
    await seen.until(lambda: bool(seen.replies), 10)
    reply = seen.replies[0]
    assert reply["status"] == "accepted", reply
    return str(reply["instance_id"])


async def _instance(gw: Gateway, instance_id: str) -> dict[str, Any]:
    port = gw.service.http.port
    url = f"http://127.0.0.1:{port}/task/instance/{instance_id}"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


def _similarity(assessment: dict[str, Any]) -> float:
    (metric,) = assessment["metrics"]
    assert metric["method"] == "text_similarity_v0"
    return float(metric["value"])


async def test_lesson_right_wrong_silent_and_asr_failure(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    async with lesson_rig(broker, tmp_path, device_id, RaisingEngine) as (
        gw,
        seen,
        device,
        backend,
    ):
        async with asyncio.TaskGroup() as tg:
            child = tg.create_task(_child(device, seen, SCRIPT), name="test.child")
            instance_id = await _start(backend, device_id, seen)
            await seen.until(lambda: bool(seen.named("instance.completed")), 60)
            await child

        # Every clip played, each next one only when the previous window's timer fired.
        played = seen.named("step.played")
        closed = seen.named("window.closed")
        assert [e["step_index"] for e in played] == [0, 1, 2, 3]
        assert [e["step_index"] for e in closed] == [0, 1, 2, 3]
        for window, nxt in zip(closed, played[1:], strict=False):
            assert nxt["ts"] >= window["data"]["planned_close_ms"]
            assert window["data"]["window_ms"] == CLIP_MS * RATIO
            assert 0 <= window["data"]["lateness_ms"] < 200  # SPEC §2.1 budget; see bench/
        runtime = gw.tasks.runtime_of(device_id)
        assert runtime is not None
        assert runtime.instance is None  # back in CHAT

        # Speech was heard in windows 0, 1 and 3; assessments for them arrive (later).
        await seen.until(lambda: len(seen.assessments) >= 3, 30)
        by_step = {a["step_index"]: a for a in seen.assessments}
        assert set(by_step) == {0, 1, 3}
        assert by_step[0]["expected_text"] == "Good morning."
        assert _similarity(by_step[0]) >= 0.8
        assert by_step[1]["expected_text"] == "How are you?"
        assert _similarity(by_step[1]) <= 0.5
        assert by_step[3]["asr_text"] is None  # the engine raised
        assert by_step[3]["metrics"] == []
        for a in seen.assessments:
            assert a["instance_id"] == instance_id
            assert a["prompt_text"].startswith("/english_learning/shadowing/lessons/unit01/")

        # What is stored agrees; the silent step has no ASR and no metrics.
        await gw.store.flush()
        stored = await _instance(gw, instance_id)
        assert stored["instance"]["state"] == "completed"
        steps = {s["step_index"]: s for s in stored["steps"]}
        assert sorted(steps) == [0, 1, 2, 3]
        assert steps[0]["metrics"][0]["value"] >= 0.8
        assert steps[2]["asr_text"] is None
        assert steps[2]["metrics"] == []
        assert steps[2]["expected_text"] == "I am fine, thank you."
        assert steps[3]["metrics"] == []
        assert seen.named("speech.started")
        # numbers, never verdicts (SPEC §2.4), in everything the backend received
        assert not verdict_keys([seen.events, seen.assessments, seen.replies, stored])


async def test_slow_asr_does_not_delay_the_lesson(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    """5 s per ASR job: the windows still close on time; assessments arrive after the lesson."""
    script = {2: "I am fine, thank you.", 3: "See you later, alligator."}
    async with lesson_rig(broker, tmp_path, device_id, SlowEngine) as (_gw, seen, device, backend):
        async with asyncio.TaskGroup() as tg:
            child = tg.create_task(_child(device, seen, script), name="test.child")
            await _start(backend, device_id, seen, params={"listen_ratio": RATIO, "start_step": 2})
            await seen.until(lambda: bool(seen.named("instance.completed")), 60)
            await child
        completed_at = seen.named("instance.completed")[0]["ts"]
        for window in seen.named("window.closed"):
            assert 0 <= window["data"]["lateness_ms"] < 200
        assert len(seen.assessments) < 2  # the lesson did not wait for them
        await seen.until(lambda: len(seen.assessments) == 2, 30)
        assert max(a["assessed_at"] for a in seen.assessments) > completed_at
        assert all(_similarity(a) >= 0.8 for a in seen.assessments)
