"""A whole gateway running lessons end to end, for the task-runtime integration tests.

Real Mosquitto, the real composed gateway (:func:`gateway.app.build_gateway`), a board
simulator as a real MQTT client, a backend client (role ``backend``) on the device's reply /
task / assessment topics and an ops client (role ``ops``) on the gateway's alarm topic. Every
message and every command the board receives is kept with the wall time (epoch ms) at which
this process received it; waits are bounded and woken by arrivals, never by polling.

    async with lesson_rig(broker, tmp_path, durations_ms=(300, 300, 300, 300)) as rig:
        reply = await rig.start(priority=2)
        await rig.wait_event("instance.completed", instance_id=reply["instance_id"])
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from devstack.gateway import ServiceRun, gateway_ready, gateway_settings, start_service
from gateway.app import Gateway, build_gateway
from gateway.settings import Settings
from gateway.simulators.board import BoardSimulator, SimOptions
from gateway.store import Store
from gateway.tasks.core import DeviceRuntime
from tests.support.broker import Broker, new_device_id
from tests.support.mqtt_client import ClientSession, Received, mqtt_client

T = TypeVar("T")
WAIT_S = 15.0
REPO = Path(__file__).resolve().parents[2]
APP, TASK, LESSON = "english_learning", "shadowing", "unit01"
CLIPS = ("01.mp3", "02.mp3", "03.mp3", "04.mp3")
HEARTBEAT_S = 5.0


def now_ms() -> float:
    return time.time_ns() / 1_000_000


def clip_path(clip: str) -> str:
    """The board path of a demo lesson clip (SPEC §5: ``/{app}/{task}/lessons/{lesson}/{clip}``)."""
    return f"/{APP}/{TASK}/lessons/{LESSON}/{clip}"


def fast_catalog(target: Path, *, durations_ms: Sequence[int], min_window_ms: int) -> Path:
    """The demo catalog with the lesson's clip durations and shortest window made test-sized."""
    entries = json.loads((REPO / "catalog/english_learning.json").read_text(encoding="utf-8"))
    for entry in entries:
        if entry["task_id"] == TASK:
            entry["min_window_ms"] = min_window_ms
            (lesson,) = (x for x in entry["lessons"] if x["lesson_id"] == LESSON)
            lesson["durations_ms"] = dict(zip(CLIPS, durations_ms, strict=True))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(entries), encoding="utf-8")
    return target


class Watch:
    """Wakes waiters whenever something arrived; they re-check their condition."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def poke(self) -> None:
        self._event.set()

    async def until(self, found: Callable[[], T | None], what: str, wait_s: float = WAIT_S) -> T:
        try:
            async with asyncio.timeout(wait_s):
                while True:
                    self._event.clear()
                    result = found()
                    if result is not None:
                        return result
                    await self._event.wait()
        except TimeoutError:
            raise AssertionError(f"not seen within {wait_s}s: {what}") from None


@dataclass(frozen=True)
class Seen:
    """A JSON message and the wall time (epoch ms) at which this process received it."""

    at_ms: float
    body: dict[str, Any]

    @property
    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.body.get("data") or {}
        return data


class TimedBoard(BoardSimulator):
    """The board simulator, also recording when each command reached it."""

    def __init__(self, *args: Any, watch: Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[Seen] = []
        self._watch = watch

    def _on_command(self, payload: bytes) -> None:
        at = now_ms()
        with contextlib.suppress(ValueError):
            body = json.loads(payload)
            if isinstance(body, dict):
                self.commands.append(Seen(at, body))
        super()._on_command(payload)
        self._watch.poke()

    def _event(self, evt: str, ref: str | None, data: dict[str, Any]) -> None:
        super()._event(evt, ref, data)
        self._watch.poke()  # waiters on ``sent_events`` re-check

    def press_button(self, press: str, key: str | None = None) -> None:
        """The board's ``button`` event (``short`` / ``long`` / ``double``; ``key``: which)."""
        data: dict[str, Any] = {"press": press}
        if key is not None:
            data["key"] = key
        self._event("button", None, data)


@dataclass
class LessonRig:
    broker: Broker
    dev: str
    settings: Settings
    board: TimedBoard
    backend: ClientSession
    ops: ClientSession
    tg: asyncio.TaskGroup
    watch: Watch = field(default_factory=Watch)
    events: list[Seen] = field(default_factory=list)
    replies: list[Seen] = field(default_factory=list)
    assessments: list[Seen] = field(default_factory=list)
    alarms: list[Seen] = field(default_factory=list)
    gateway: Gateway | None = None
    _run: ServiceRun | None = None

    # -- the gateway ----------------------------------------------------------------------------

    @property
    def gw(self) -> Gateway:
        assert self.gateway is not None, "gateway not started"
        return self.gateway

    async def start_gateway(self) -> Gateway:
        """Build and serve a gateway (``running_gateway``'s steps, but stoppable mid-test)."""
        gw = build_gateway(self.settings)
        self.gateway = gw
        self._run = await start_service(gw.service, self.tg, ready=gateway_ready(gw))
        return gw

    async def stop_gateway(self, *, kill: bool = False) -> None:
        """Graceful stop, or ``kill``: cancel the service at once (no shutdown path)."""
        run, self._run = self._run, None
        if run is not None:
            await run.stop(kill=kill)

    def runtime(self) -> DeviceRuntime | None:
        return self.gw.tasks.runtime_of(self.dev)

    def store(self) -> Store:
        return self.gw.store

    def metric(self, key: str) -> float:
        return self.gw.service.metrics.snapshot().get(f"snlpgw_{key}", 0.0)

    def lateness(self) -> dict[str, float]:
        snapshot = self.gw.service.metrics.snapshot()
        return {
            stat: snapshot.get(f'snlpgw_window_lateness_ms{{stat="{stat}"}}', float("nan"))
            for stat in ("p50", "p99", "max", "count")
        }

    async def http_get(self, path: str) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{self.gw.service.admin.port}{path}"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            return resp.status, await resp.json()

    # -- control ----------------------------------------------------------------------------------

    async def request(self, action: str, **fields: Any) -> dict[str, Any]:
        """Publish a control request and return its reply (matched by ``ref``)."""
        rid = f"rq-{uuid.uuid4().hex[:10]}"
        body = {"v": 1, "id": rid, "action": action, **fields}
        await self.backend.publish(f"snlpgw/v1/ctl/{self.dev}", json.dumps(body))
        seen = await self.watch.until(
            lambda: next((r for r in self.replies if r.body.get("ref") == rid), None),
            f"reply to {action} {rid}",
        )
        return seen.body

    async def start(self, *, priority: int = 2, task: str = TASK, **params: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {"app_id": APP, "task_id": task, "lesson_id": LESSON}
        return await self.request(
            "start", **fields, priority=priority, source="test", params=params or None
        )

    # -- what happened ----------------------------------------------------------------------------

    def task_events(self, name: str | None = None, *, instance_id: str | None = None) -> list[Seen]:
        return [
            e
            for e in self.events
            if (name is None or e.body.get("event") == name)
            and (instance_id is None or e.body.get("instance_id") == instance_id)
        ]

    def find_event(
        self, name: str, step_index: int | None = None, *, instance_id: str | None = None
    ) -> Seen | None:
        for e in self.task_events(name, instance_id=instance_id):
            if step_index is None or e.body.get("step_index") == step_index:
                return e
        return None

    async def wait_event(
        self,
        name: str,
        step_index: int | None = None,
        *,
        instance_id: str | None = None,
        wait_s: float = WAIT_S,
    ) -> Seen:
        """The first task event ``name`` (of that step / instance) received, waiting for it."""
        return await self.watch.until(
            lambda: self.find_event(name, step_index, instance_id=instance_id),
            f"task event {name} step={step_index} instance={instance_id}",
            wait_s,
        )

    def commands(self, cmd: str | None = None) -> list[Seen]:
        """Commands the board received, first receipt of each id only: a resend with the same
        id (delivery retry, e.g. after the board reconnects) is deduplicated by the board."""
        seen: set[str] = set()
        out = []
        for c in self.board.commands:
            if cmd is not None and c.body.get("cmd") != cmd:
                continue
            if c.body.get("id") not in seen:
                seen.add(c.body.get("id", ""))
                out.append(c)
        return out

    async def wait_command(self, cmd: str, count: int = 1, wait_s: float = WAIT_S) -> list[Seen]:
        """Wait until the board received ``count`` commands ``cmd``; returns them all."""
        return await self.watch.until(
            lambda: found if len(found := self.commands(cmd)) >= count else None,
            f"{count}x {cmd} at the board",
            wait_s,
        )

    async def wait_alarm(self, alarm: str, wait_s: float = WAIT_S) -> Seen:
        return await self.watch.until(
            lambda: next((a for a in self.alarms if a.body.get("alarm") == alarm), None),
            f"ops alarm {alarm}",
            wait_s,
        )

    async def board_online(self) -> None:
        async with asyncio.timeout(WAIT_S):
            await self.board.connected.wait()

    # -- collectors ---------------------------------------------------------------------------------

    async def _pump(self, session: ClientSession) -> None:
        while True:
            message: Received = await session.queue.get()
            at = now_ms()
            try:
                body = json.loads(message.payload)
            except ValueError:
                continue
            topic = message.topic
            if topic.startswith("snlpgw/v1/task/"):
                self.events.append(Seen(at, body))
            elif topic.startswith("snlpgw/v1/reply/"):
                self.replies.append(Seen(at, body))
            elif topic.startswith("snlpgw/v1/assessment/"):
                self.assessments.append(Seen(at, body))
            elif topic.endswith("/events"):
                self.alarms.append(Seen(at, body))
            self.watch.poke()


@contextlib.asynccontextmanager
async def lesson_rig(
    broker: Broker,
    tmp: Path,
    *,
    durations_ms: Sequence[int] = (300, 300, 300, 300),
    min_window_ms: int = 300,
    start: bool = True,
    sim: Mapping[str, Any] | None = None,
    board_durations: Mapping[str, int] | None = None,
    board_lacks: frozenset[str] = frozenset(),
    **overrides: Any,
) -> AsyncIterator[LessonRig]:
    """A gateway (started unless ``start=False``), a connected board and the test clients.

    ``overrides`` are settings sections merged over the rig's (e.g. ``runtime={...}``,
    ``store={...}``); ``sim``: board simulator options (``SimOptions`` fields). The board
    "plays" clip *i* for ``durations_ms[i]`` ms (other board paths: ``board_durations``) and
    rejects the commands in ``board_lacks``.
    """
    dev = new_device_id()
    catalog = fast_catalog(
        tmp / "catalog.json", durations_ms=durations_ms, min_window_ms=min_window_ms
    )
    sections: dict[str, Any] = {
        "asr": {"engine": "none"},
        "runtime": {"catalog_path": catalog, "min_window_ms": min_window_ms},
        "board": {"heartbeat_s": HEARTBEAT_S},
    }
    for key, value in overrides.items():
        sections[key] = {**sections.get(key, {}), **value}
    settings = gateway_settings(broker, tmp / "data", **sections)
    watch = Watch()
    creds = broker.provision(dev)
    board = TimedBoard(
        dev,
        host=broker.host,
        port=broker.port,
        username=creds.username,
        password=creds.password,
        options=SimOptions(
            heartbeat_s=HEARTBEAT_S,
            durations={
                **{clip_path(c): d for c, d in zip(CLIPS, durations_ms, strict=True)},
                **(board_durations or {}),
            },
            unsupported=board_lacks,
            **(sim or {}),
        ),
        watch=watch,
    )
    tag = uuid.uuid4().hex[:8]
    backend_creds = broker.provision(f"backend-{tag}", role="backend")
    ops_creds = broker.provision(f"ops-{tag}", role="ops")
    async with (
        mqtt_client(broker, backend_creds) as backend,
        mqtt_client(broker, ops_creds) as ops,
        asyncio.TaskGroup() as tg,
    ):
        # A refused subscription (SUBACK >= 128) fails here, not as a wait that times out. (An
        # ACL that does not cover it is no refusal: Mosquitto grants it and filters at delivery;
        # `broker.provision` waiting for the login is what keeps the ACL in place.)
        for kind in ("reply", "task", "assessment"):
            assert max(await backend.subscribe(f"snlpgw/v1/{kind}/{dev}")) < 128, kind
        assert max(await ops.subscribe(f"snlpgw/v1/ops/{settings.gateway_id}/events")) < 128
        rig = LessonRig(broker, dev, settings, board, backend, ops, tg, watch=watch)
        helpers = [
            tg.create_task(rig._pump(backend), name=f"rig[{dev}].backend"),
            tg.create_task(rig._pump(ops), name=f"rig[{dev}].ops"),
            tg.create_task(board.run(), name=f"device[{dev}].sim"),
        ]
        try:
            if start:
                await rig.start_gateway()
            await rig.board_online()
            yield rig
        finally:
            await rig.stop_gateway()
            for task in helpers:
                task.cancel()
