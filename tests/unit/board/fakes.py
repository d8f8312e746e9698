"""Hand-written fakes at the board channel's edges (router, alarms, clock; the publisher is the
one in tests/support/fake_mqtt.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.board.channel import BoardChannel, BoardEventSink
from gateway.board.model import BoardEvent, PresenceChange
from gateway.metrics import Metrics
from gateway.mqtt.edge import Handler, Inbound
from gateway.settings import BoardSettings
from tests.support.fake_mqtt import FakePublisher

DEV = "aa_bb_cc_dd_ee_01"
DEV2 = "aa_bb_cc_dd_ee_02"


@dataclass
class FakeRouter:
    routes: dict[str, Handler] = field(default_factory=dict)

    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None:
        self.routes[topic_filter] = handler


@dataclass
class FakeAlarms:
    raised: list[tuple[str, str | None, dict[str, object]]] = field(default_factory=list)

    def alarm(self, alarm: str, *, device: str | None = None, **detail: object) -> None:
        self.raised.append((alarm, device, detail))

    def names(self) -> list[str]:
        return [a for a, _, _ in self.raised]


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class BoardSink:
    also: BoardEventSink | None = None  # told everything too (e.g. BoardToTasks)
    events: list[BoardEvent] = field(default_factory=list)
    changes: list[PresenceChange] = field(default_factory=list)

    def board_event(self, event: BoardEvent) -> None:
        self.events.append(event)
        if self.also is not None:
            self.also.board_event(event)

    def presence_changed(self, change: PresenceChange) -> None:
        self.changes.append(change)
        if self.also is not None:
            self.also.presence_changed(change)


@dataclass
class BoardRig:
    channel: BoardChannel
    pub: FakePublisher
    router: FakeRouter
    alarms: FakeAlarms
    clock: Clock
    sink: BoardSink
    metrics: Metrics

    def deliver(self, dev: str, kind: str, payload: bytes | dict[str, Any] | str) -> None:
        if isinstance(payload, dict):
            data = json.dumps(payload).encode()
        elif isinstance(payload, str):
            data = payload.encode()
        else:
            data = payload
        msg = Inbound(f"snlp/v1/{dev}/{kind}", data, 1, False, self.clock.now, 1_764_460_800_000)
        self.channel.handle(msg)

    def hb(self, dev: str = DEV, **extra: Any) -> None:
        self.deliver(dev, "hb", {"v": 1, "id": "h", "ts": 1, **extra})

    def ack(self, ref: str, status: str = "accepted", dev: str = DEV) -> None:
        self.deliver(dev, "ack", {"v": 1, "id": "a", "ts": 1, "ref": ref, "status": status})

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.channel.tick()

    def commands(self, dev: str = DEV) -> list[dict[str, Any]]:
        return [p.json() for p in self.pub.on(f"{dev}/cmd")]

    def metric(self, key: str) -> float:
        return self.metrics.snapshot().get(f"snlpgw_{key}", 0.0)


def make_rig(
    *,
    also: BoardEventSink | None = None,
    owns: Callable[[str], bool] = lambda _dev: True,
    **settings: Any,
) -> BoardRig:
    base: dict[str, Any] = {"ack_timeout_s": 3.0, "max_resends": 2, "heartbeat_s": 30.0}
    s = BoardSettings(**{**base, **settings})
    clock, sink, metrics = Clock(), BoardSink(also), Metrics()
    pub, router, alarms = FakePublisher(), FakeRouter(), FakeAlarms()
    channel = BoardChannel(
        settings=s,
        router=router,
        publisher=pub,
        metrics=metrics,
        alarms=alarms,
        sink=sink,
        owns=owns,
        max_devices=2,
        clock=clock,
        wall_ms=lambda: 1_764_460_800_000,
    )
    return BoardRig(channel, pub, router, alarms, clock, sink, metrics)
