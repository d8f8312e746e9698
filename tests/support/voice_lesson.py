"""A shadowing lesson over real components, for the voice end-to-end tests and benchmarks:
Mosquitto, the gateway, a board simulator and a Xiaozhi device simulator that reads a script
into the listen windows (espeak-ng speech over encrypted UDP).
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

from devstack.gateway import gateway_settings, serving
from gateway.app import Gateway, build_gateway
from gateway.assessment.engine import Backend
from gateway.assessment.procslot import ProcessBackend
from gateway.simulators.board import BoardSimulator, SimOptions
from gateway.simulators.xiaozhi import XiaozhiDeviceSim
from tests.support.broker import Broker
from tests.support.mqtt_client import ClientSession, mqtt_client
from tests.support.speech import silence, synthesize
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


async def watch(backend: ClientSession, dev: str, seen: Observed) -> None:
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


async def child(device: XiaozhiDeviceSim, seen: Observed, script: dict[int, str | None]) -> None:
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
    broker: Broker,
    tmp_path: Path,
    device_id: str,
    engine: type,
    *,
    clip_ms: int = CLIP_MS,
    archive: dict[str, Any] | None = None,
    asr_backend: Backend | None = None,  # instead of ``engine`` in a process (e.g. HTTP)
    resource_dir: Path | None = None,
    speech: dict[str, Any] | None = None,  # speech settings over the test's (e.g. presynth)
    asr: dict[str, Any] | None = None,  # asr settings over the test's (e.g. queue_limit)
) -> AsyncIterator[tuple[Gateway, Observed, XiaozhiDeviceSim, ClientSession]]:
    # The production layout: the gateway's data dir holds the broker files, so OTA provisioning
    # rotates real credentials and reloads the real broker; SQLite is the test's own.
    settings = gateway_settings(
        broker,
        broker.data_dir,
        runtime={"catalog_path": CATALOG, "resource_dir": resource_dir or CATALOG / "resources"},
        asr={"workers": 1, **(asr or {})},
        store={"sqlite_path": tmp_path / "gateway.sqlite3"},
        archive={"dir": tmp_path / "audio", **(archive or {})},  # the test's own answers
        **({"speech": speech} if speech else {}),
    )
    gw = build_gateway(
        settings, asr_backend=asr_backend or ProcessBackend(engine, name=engine.__name__.lower())
    )
    backend_user = broker.provision(f"be-{device_id[-5:].replace('_', '')}", role="backend")
    seen = Observed()
    async with serving(gw.service) as svc:
        # One physical board: it provisions over OTA, and both its channels use those credentials.
        device = XiaozhiDeviceSim(mac=mac_colon(device_id))
        info = await device.provision(f"http://127.0.0.1:{svc.http.port}/xiaozhi/ota/")
        board = BoardSimulator(
            device_id,
            host=broker.host,
            port=broker.port,
            username=info.username,
            password=info.password,
            options=SimOptions(default_duration_ms=clip_ms, heartbeat_s=5.0),
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
                tg.create_task(watch(backend, device_id, seen), name="test.watch"),
            ]
            await device.open_audio_channel()
            async with asyncio.timeout(10):
                await board.connected.wait()
            try:
                yield gw, seen, device, backend
            finally:
                for task in tasks:
                    task.cancel()


async def start(backend: ClientSession, dev: str, seen: Observed, **fields: Any) -> str:
    request = {"v": 1, "id": "r1", "action": "start", "app_id": "english_learning",
               "task_id": "shadowing", "lesson_id": "unit01", "priority": 3,
               "params": {"listen_ratio": RATIO}, **fields}  # fmt: skip
    await backend.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(request))
    await seen.until(lambda: bool(seen.replies), 10)
    reply = seen.replies[0]
    assert reply["status"] == "accepted", reply
    return str(reply["instance_id"])


async def scripted_lesson(
    device: XiaozhiDeviceSim, seen: Observed, backend: ClientSession, dev: str
) -> str:
    """Start the lesson and let the child answer with :data:`SCRIPT` until it completes; its
    instance id."""
    async with asyncio.TaskGroup() as tg:
        reader = tg.create_task(child(device, seen, SCRIPT), name="test.child")
        instance_id = await start(backend, dev, seen)
        await seen.until(lambda: bool(seen.named("instance.completed")), 60)
        await reader
    return instance_id


async def fetch_instance(gw: Gateway, instance_id: str) -> dict[str, Any]:
    port = gw.service.admin.port
    url = f"http://127.0.0.1:{port}/task/instance/{instance_id}"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body
