"""The gateway's outbound MQTT lanes and their pipelined publish loop.

Two lanes, each bounded, each with its overflow policy (issue #14):

* ``CONTROL`` — board commands, control replies, presence: never dropped. When full (the
  broker has been away long enough for ``control_limit`` of them to pile up), ``put`` refuses
  the newest, counts it and returns ``False``; the caller decides (a board command's ack
  deadline still runs, so the command is retried or ends ``failed``/``expired``).
* ``EVENTS`` — task events, assessment results, ops metrics and alarms: overflow drops the
  oldest and counts it.

Both are kept while the broker is away. While connected, up to ``window`` QoS 1 publishes are
in flight at once (written, PUBACK not back yet; never more than the broker's Receive Maximum
from its CONNACK); CONTROL goes first, then EVENTS, each in queue order, and EVENTS never take
the last quarter of the window, so a board command does not wait behind task events' PUBACKs. A publish put while
the window and the socket have room is written at once, in the caller's turn of the loop (no
wake-up of the pump task: one loop turn less on the hot path); the pump sends the rest as
confirmations free the window. A topic always goes through the same lane (the lane is chosen
from the topic), so the broker forwards one topic's messages in the order they were put (MQTT §4.6): a board's
LISTEN_STOP and its next PLAY_MEDIA leave back to back. ``on_sent`` runs when a message is
written to the socket (a board command's ack deadline counts from then, not from the queue).
When the connection breaks, the messages not confirmed stay in the session's in-flight table
(:mod:`gateway.mqtt.session`), which sends them again, with their packet ids, before anything
new after the reconnect (at least once). A message the broker refuses (PUBACK >= 0x80), one the
poison rule drops and one MQTT forbids (an invalid topic, over the broker's Maximum Packet
Size) is counted through ``failed``/``invalid`` and never queued again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.options import MqttError
from gateway.mqtt.session import Failed, InvalidPublish


class Lane(Enum):
    CONTROL = "control"  # never dropped; newest refused (counted) when full
    EVENTS = "events"  # drop oldest (counted) when full


@dataclass(frozen=True, slots=True)
class Outbound:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    correlation_data: bytes | None = None
    expiry_s: int | None = None
    lane: Lane = Lane.CONTROL
    on_sent: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class OutboundCounters:
    """Callbacks into the connection's metrics (plain callables: tests need no registry)."""

    dropped: Callable[[Outbound], None]  # EVENTS overflow: the oldest message went
    refused: Callable[[Outbound], None]  # CONTROL full: the newest was not queued
    published: Callable[[], None]  # confirmed (PUBACK for QoS 1, written for QoS 0)
    failed: Callable[[Outbound, Failed], None]  # the broker refused it, or it was poison
    invalid: Callable[[Outbound, InvalidPublish], None]  # MQTT forbids it: never sent
    fallback: Callable[[str], None]  # sent at QoS 0 or unretained: the broker offers no more


class OutboundQueue:
    def __init__(
        self, *, control_limit: int, events_limit: int, window: int, counters: OutboundCounters
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._control_limit, self._events_limit = control_limit, events_limit
        self._window = window
        # EVENTS never take the last quarter of the window: a board command put while task
        # events fill it goes at once instead of waiting for their PUBACKs (at 200 speaking
        # lessons ~10 events a clip step held PLAY_MEDIA back up to ~0.1 s at p99).
        self._events_window = window - window // 4
        self._counters = counters
        # Bounded by the two limits (CONTROL: refuse newest; EVENTS: drop oldest), both counted.
        # The hot path reaches the two deques by attribute (an Enum key hashes in Python).
        self._control: deque[Outbound] = deque()
        self._events: deque[Outbound] = deque()
        self._lanes = {Lane.CONTROL: self._control, Lane.EVENTS: self._events}
        # Written and not confirmed yet (QoS 1 only; at most ``window``), kept across
        # connections like the session's table that resends them.
        self._in_flight: dict[int, Outbound] = {}
        self._tokens = itertools.count()
        self._ready = asyncio.Event()
        self._client: Client | None = None  # while a pump serves a connection

    def __len__(self) -> int:
        return len(self._control) + len(self._events) + len(self._in_flight)

    def queued(self, lane: Lane | None = None) -> list[Outbound]:
        """What waits to go out (one lane, or CONTROL then EVENTS), oldest first (a copy)."""
        lanes = [lane] if lane is not None else [Lane.CONTROL, Lane.EVENTS]
        return [m for name in lanes for m in self._lanes[name]]

    def put(self, msg: Outbound) -> bool:
        """Queue ``msg`` in its lane; ``False`` if CONTROL was full and refused it (counted)."""
        control = msg.lane is Lane.CONTROL
        lane, limit = (
            (self._control, self._control_limit) if control else (self._events, self._events_limit)
        )
        if len(lane) >= limit:
            if control:
                self._counters.refused(msg)
                return False
            self._counters.dropped(lane.popleft())
        lane.append(msg)
        client = self._client
        if client is not None:
            # Now, in the caller's turn, if the window has room. MqttError: the connection is
            # gone; the pump ends and puts back what was not confirmed.
            with contextlib.suppress(MqttError):
                self._send_ready(client)
        if self._control or self._events:
            self._ready.set()
        return True

    async def pump(self, client: Client) -> None:
        """Publish while connected; raises :class:`~gateway.mqtt.options.MqttError` when the
        connection is gone (what is in flight stays with the session)."""
        self._client = client
        # PUBACKs (also of publishes not ours) open room: refilled in the reading callback.
        client.on_room = functools.partial(self._refill, client)
        try:
            while True:
                self._ready.clear()
                self._send_ready(client)
                if self._sendable(client):
                    await client.writable.wait()  # the socket buffer is full: let it drain
                    continue
                await self._ready.wait()
        finally:
            client.on_room = None
            self._client = None

    def _refill(self, client: Client) -> None:
        """PUBACKs were read: refill the window now, in the callback that read them. Waking
        the pump instead cost a loop turn per refill, and under load a turn is long: with the
        broker's 20-slot window that capped the gateway at ~20 publishes a turn (at 1,000
        speaking lessons PLAY_MEDIA waited up to ~2 s behind task events)."""
        with contextlib.suppress(MqttError):  # gone: the pump ends, what is queued stays
            self._send_ready(client)
        if self._control or self._events:
            self._ready.set()

    def _sendable(self, client: Client) -> bool:
        """Something queued may go as soon as the socket has room."""
        if self._control:
            return client.room(self._window)
        return bool(self._events) and client.room(self._events_window)

    def _send_ready(self, client: Client) -> None:
        """Write queued publishes, CONTROL first, while the window (EVENTS: all of it but the
        quarter kept for CONTROL) and the socket have room."""
        control, events = self._control, self._events
        while self._sendable(client) and client.writable.is_set():
            self._send(client, control.popleft() if control else events.popleft())

    def _send(self, client: Client, msg: Outbound) -> None:
        props = b""
        if msg.correlation_data is not None or msg.expiry_s is not None:
            props = codec.publish_properties(msg.correlation_data, msg.expiry_s)
        on_done: Callable[[], None] | None = None
        on_failed: Callable[[Failed], None] | None = None
        token = 0
        if msg.qos:
            token = next(self._tokens)
            on_done = lambda: self._confirmed(token)  # noqa: E731 - a closure per publish
            on_failed = lambda event: self._failed(token, event)  # noqa: E731
        try:
            sent = client.publish(
                msg.topic, msg.payload, qos=msg.qos, retain=msg.retain, properties=props,
                on_done=on_done, on_failed=on_failed,
            )  # fmt: skip
        except InvalidPublish as exc:
            self._counters.invalid(msg, exc)
            return
        except BaseException:
            self._lanes[msg.lane].appendleft(msg)
            raise
        if sent.qos_downgraded:
            self._counters.fallback("qos_downgraded")
        if sent.retain_dropped:
            self._counters.fallback("retain_dropped")
        if sent.packet_id:
            self._in_flight[token] = msg
        if msg.on_sent is not None:
            msg.on_sent()
        if not sent.packet_id:
            self._counters.published()

    def _confirmed(self, token: int) -> None:
        if self._in_flight.pop(token, None) is not None:
            self._counters.published()
        if self._control or self._events:
            self._ready.set()  # a slot for what waits

    def _failed(self, token: int, event: Failed) -> None:
        msg = self._in_flight.pop(token, None)
        if msg is not None:
            self._counters.failed(msg, event)
        if self._control or self._events:
            self._ready.set()


# Telemetry the backend and ops can lose under overload (oldest first, counted); everything
# else a gateway publishes (board commands, control replies and MQTT 5 responses, presence,
# Xiaozhi downlink) is control and never dropped.
_EVENT_PREFIXES = ("snlpgw/v1/task/", "snlpgw/v1/assessment/", "snlpgw/v1/ops/")


def lane_for(topic: str) -> Lane:
    """The outbound lane of ``topic``: one topic, one lane, so its order is kept."""
    return Lane.EVENTS if topic.startswith(_EVENT_PREFIXES) else Lane.CONTROL
