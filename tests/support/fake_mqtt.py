"""The one fake MQTT edge (:class:`gateway.mqtt.edge.Publisher` plus ``route``) for shell unit tests
and the in-process benchmarks: it records what is published and which routes were registered,
delivers inbound messages to those routes, and can hold publishes in its outbox (their
``on_sent`` callbacks run on :meth:`release`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.mqtt.edge import Handler, Inbound


@dataclass
class Published:
    topic: str
    payload: bytes
    qos: int
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


@dataclass
class FakePublisher:
    sent: list[Published] = field(default_factory=list)
    routes: list[tuple[str, Handler, int]] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)  # set by every publish
    hold: bool = False  # True: publishes wait in the outbox until release()
    held: list[Callable[[], None]] = field(default_factory=list)

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        qos: int = 0,
        retain: bool = False,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        data = payload.encode() if isinstance(payload, str) else payload
        self.sent.append(Published(topic, data, qos, retain))
        self.event.set()
        if on_sent is not None and self.hold:
            self.held.append(on_sent)
        elif on_sent is not None:
            on_sent()  # written at once, as by a connected client with room in its window

    def release(self) -> None:
        """The held publishes leave (their on_sent callbacks run, in order)."""
        self.hold = False
        held, self.held = self.held, []
        for on_sent in held:
            on_sent()

    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None:
        self.routes.append((topic_filter, handler, qos))

    def on(self, suffix: str) -> list[Published]:
        """What was published to topics ending in ``suffix``."""
        return [p for p in self.sent if p.topic.endswith(suffix)]

    def bodies(self, suffix: str) -> list[Any]:
        """The JSON bodies published to topics ending in ``suffix``."""
        return [p.json() for p in self.on(suffix)]

    def deliver(
        self, topic: str, body: dict[str, Any], *, response_topic: str | None = None
    ) -> None:
        """An inbound JSON message on ``topic``, to every registered route (QoS 1)."""
        payload = json.dumps(body).encode()
        for _filter, handler, _qos in self.routes:
            handler(Inbound(topic, payload, 1, False, 0.0, 0, response_topic, b"corr"))

    async def wait_for(self, predicate: Callable[[], bool], wait_s: float = 5.0) -> None:
        """Wait (event-driven, bounded) until ``predicate`` holds after some publish."""
        async with asyncio.timeout(wait_s):
            while not predicate():
                self.event.clear()
                await self.event.wait()
