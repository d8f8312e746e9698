"""The gateway's outbound MQTT queue and its pipelined publish loop.

* ``put`` never blocks and never raises. The queue is bounded (``limit``): overflow drops the
  oldest message and counts it; it is kept while the broker is away.
* While connected, up to ``window`` publishes are in flight at once (handed to the client, the
  QoS 1 PUBACK not yet back), taken from the queue in order. The client writes them in that
  order on its one connection, and the broker forwards one publisher's messages on a topic in
  the order it received them (MQTT §4.6), so a board's LISTEN_STOP and its next PLAY_MEDIA
  leave back to back instead of one broker round trip apart (``window=1`` was the old way).
* When the connection breaks, every message not confirmed goes back to the head of the queue,
  in its original order, and is published again after the reconnect (at least once).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


@dataclass(frozen=True, slots=True)
class Outbound:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    correlation_data: bytes | None = None
    expiry_s: int | None = None


@dataclass(frozen=True, slots=True)
class OutboundCounters:
    """Callbacks into the connection's metrics (plain callables: tests need no registry)."""

    dropped: Callable[[Outbound], None]  # overflow: the oldest message went
    published: Callable[[], None]  # confirmed by the client (PUBACK for QoS 1)
    depth: Callable[[int], None]  # queued + in flight


class OutboundQueue:
    def __init__(self, *, limit: int, window: int, counters: OutboundCounters) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._limit = limit
        self._window = window
        self._counters = counters
        # Bounded by ``limit``; overflow drops the oldest (counted).
        self._queue: deque[Outbound] = deque()
        # The messages handed to the client and not confirmed yet, in send order (≤ window).
        self._in_flight: dict[asyncio.Task[None], Outbound] = {}
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue) + len(self._in_flight)

    def queued(self) -> list[Outbound]:
        """What waits to go out, oldest first (a copy)."""
        return list(self._queue)

    def put(self, msg: Outbound) -> None:
        self._queue.append(msg)
        if len(self._queue) > self._limit:
            self._counters.dropped(self._queue.popleft())
        self._counters.depth(len(self))
        self._ready.set()

    async def pump(self, client: aiomqtt.Client) -> None:
        """Publish while connected; raises ``MqttError`` when a publish fails (the caller
        reconnects) and puts back whatever was not confirmed when it ends, however it ends."""
        try:
            async with asyncio.TaskGroup() as tg:
                while True:
                    self._ready.clear()
                    while self._queue and len(self._in_flight) < self._window:
                        msg = self._queue.popleft()
                        task = tg.create_task(_publish(client, msg), name="mqtt.publish")
                        self._in_flight[task] = msg
                        task.add_done_callback(self._settled)
                    await self._ready.wait()
        except* aiomqtt.MqttError as group:
            raise group.exceptions[0] from None
        finally:
            self._queue.extendleft(reversed(self._in_flight.values()))
            self._in_flight.clear()
            self._counters.depth(len(self))

    def _settled(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is None and task in self._in_flight:
            del self._in_flight[task]
            self._counters.published()
            self._counters.depth(len(self))
        self._ready.set()


async def _publish(client: aiomqtt.Client, msg: Outbound) -> None:
    props: Properties | None = None
    if msg.correlation_data is not None or msg.expiry_s is not None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # paho is untyped here
        if msg.correlation_data is not None:
            props.CorrelationData = msg.correlation_data
        if msg.expiry_s is not None:
            props.MessageExpiryInterval = msg.expiry_s
    await client.publish(msg.topic, msg.payload, qos=msg.qos, retain=msg.retain, properties=props)
