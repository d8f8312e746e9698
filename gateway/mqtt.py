"""The gateway's broker connection: one aiomqtt (paho, MQTT 5) client, owned by the service.

Components never touch the client. They register routes (topic filter → handler) before the
service starts and call :meth:`MqttConnection.publish`, which never blocks and never raises:

* Handlers are plain functions run on the loop; they must only parse and enqueue (a handler
  that raises is logged with the topic and counted; the connection goes on).
* Publishes go through a bounded outbound queue (:mod:`gateway.mqtt_outbound`) that is drained
  while connected, ``mqtt.max_inflight`` publishes at a time in queue order, and kept while the
  broker is away. Overflow policy: the oldest message is dropped and counted. Publishes in
  flight when the connection breaks are put back at the head of the queue, in order.
* Inbound payloads over ``max_payload_bytes`` are dropped and counted before any parsing.
* Received messages wait for the loop in a queue of ``inbound_queue`` messages. Overflow
  policy: the newest message is dropped and counted (``mqtt_messages_in_dropped{reason=
  "queue_full"}``); a flood costs its own messages, and acks already queued still go through.
* A publish bigger than the broker's ``max_packet_size`` is dropped and counted: the broker
  would disconnect the gateway for it.
* Retained messages are delivered with ``Inbound.retain`` set; handlers of device topics
  ignore them (a device could otherwise have its events replayed at every resubscribe).
* Reconnect with capped exponential back-off and jitter; every route is resubscribed and the
  retained gateway presence republished on each connect. The presence LWT is registered with
  the broker so a crash shows ``online: false``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiomqtt

from gateway.backoff import BackoffPolicy, FailureStreak
from gateway.metrics import Metrics
from gateway.mqtt_connect import connected
from gateway.mqtt_outbound import Outbound, OutboundCounters, OutboundQueue
from gateway.settings import MqttSettings
from topics import GatewayStatus, encode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Inbound:
    """One received message, as handlers see it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    received_mono: float  # time.monotonic() at receipt
    received_ms: int  # gateway wall clock, epoch ms (board clocks may be shifted)
    response_topic: str | None = None
    correlation_data: bytes | None = None


Handler = Callable[[Inbound], None]


class Publisher(Protocol):
    """What components need to publish; the fake in shell unit tests implements the same."""

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        qos: int = 0,
        retain: bool = False,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
    ) -> None: ...


@dataclass(slots=True)
class _Route:
    topic_filter: str
    handler: Handler
    qos: int


class MqttConnection:
    def __init__(
        self,
        *,
        settings: MqttSettings,
        password: str | None,
        client_id: str,
        presence_topic: str,
        presence_payload: Callable[[bool], bytes],
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._password = password
        self._client_id = client_id
        self._presence_topic = presence_topic
        self._presence_payload = presence_payload
        self._routes: list[_Route] = []
        self._connected = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()
        self._connections = 0
        self.received = 0  # messages taken off the inbound queue (tests wait on this)
        self._in_overflows = 0
        self._backoff = FailureStreak(
            BackoffPolicy(settings.reconnect_min_s, settings.reconnect_max_s, jitter=True)
        )

        self.m_connected = metrics.gauge("mqtt_connected", "1 while connected to the broker")
        self.m_connects = metrics.counter("mqtt_connects", "Successful broker connections")
        self.m_in = metrics.counter("mqtt_messages_in", "Messages received")
        self.m_in_dropped = metrics.counter(
            "mqtt_messages_in_dropped", "Inbound messages dropped", ["reason"]
        )
        self.m_out = metrics.counter("mqtt_messages_out", "Messages published")
        self.m_out_dropped = metrics.counter(
            "mqtt_messages_out_dropped", "Outbound messages dropped (queue overflow)"
        )
        self.m_out_queue = metrics.gauge("mqtt_outbound_queue", "Publishes waiting for the broker")
        self.m_out_oversize = metrics.counter(
            "mqtt_messages_out_oversize",
            "Publishes dropped as bigger than the broker's max_packet_size",
        )
        # Bounded; overflow drops the oldest (counted). Presence is re-sent on every connect.
        self._outbox = OutboundQueue(
            limit=settings.outbound_queue,
            window=settings.max_inflight,
            counters=OutboundCounters(
                dropped=self._dropped, published=self.m_out.inc, depth=self.m_out_queue.set
            ),
        )

    # -- component API ---------------------------------------------------------------------

    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None:
        """Register a subscription; restored on every (re)connect."""
        self._routes.append(_Route(topic_filter, handler, qos))

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def connection_count(self) -> int:
        return self._connections

    async def wait_connected(self) -> None:
        await self._connected.wait()

    async def wait_disconnected(self) -> None:
        await self._disconnected.wait()

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        qos: int = 0,
        retain: bool = False,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
    ) -> None:
        data = payload.encode() if isinstance(payload, str) else payload
        # The broker disconnects a client for a packet over its max_packet_size; refuse it here
        # (counted) so one oversized message never costs the connection. 256 bytes cover the
        # fixed header and properties.
        if len(data) + len(topic.encode()) + 256 > self._settings.broker_max_packet_bytes:
            self.m_out_oversize.inc()
            log.error("dropped %d-byte publish on %s: over the broker's limit", len(data), topic)
            return
        self._outbox.put(Outbound(topic, data, qos, retain, correlation_data, expiry_s))

    def _dropped(self, msg: Outbound) -> None:
        self.m_out_dropped.inc()
        log.warning("outbound queue full: dropped oldest publish on %s", msg.topic)

    # -- service task ----------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect; returns only when cancelled."""
        while True:
            try:
                await self._serve_once()
            except aiomqtt.MqttError as exc:
                self._mark_disconnected()
                delay = self._backoff.failed()
                log.warning("broker connection lost (%s); reconnecting in %.2fs", exc, delay)
                await asyncio.sleep(delay)

    async def close(self, grace_s: float) -> None:
        """Announce ``online: false`` and disconnect cleanly (no LWT); bounded by ``grace_s``."""
        client = self._client
        if client is None or not self.connected:
            return
        with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
            await client.publish(
                self._presence_topic,
                self._presence_payload(False),
                qos=1,
                retain=True,
                timeout=grace_s,
            )

    _client: aiomqtt.Client | None = None

    async def _serve_once(self) -> None:
        client = self._make_client()
        await self._serve_client(client, _cancel_count())

    async def _serve_client(self, client: aiomqtt.Client, baseline: int) -> None:
        async with connected(client):  # a cancelled connect is settled, not abandoned
            _honour_lost_cancel(baseline)
            self._client = client
            try:
                for route in self._routes:
                    await client.subscribe(route.topic_filter, qos=route.qos)
                    _honour_lost_cancel(baseline)
                await client.publish(
                    self._presence_topic, self._presence_payload(True), qos=1, retain=True
                )
                _honour_lost_cancel(baseline)
                self._connections += 1
                self.m_connects.inc()
                self.m_connected.set(1)
                self._connected.set()
                self._disconnected.clear()
                self._backoff.reset()
                log.info(
                    "connected to broker %s as %s", self._settings.url, self._settings.username
                )
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._outbox.pump(client), name="mqtt.publish")
                    tg.create_task(self._receive_loop(client), name="mqtt.receive")
            except* aiomqtt.MqttError as group:
                raise group.exceptions[0] from None
            finally:
                self._client = None

    def _make_client(self) -> aiomqtt.Client:
        s = self._settings
        on_overflow = self._inbound_overflow
        tls: ssl.SSLContext | None = ssl.create_default_context() if s.tls else None
        client = aiomqtt.Client(
            s.host,
            s.port,
            username=s.username,
            password=self._password,
            identifier=self._client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            keepalive=s.keepalive_s,
            will=aiomqtt.Will(
                self._presence_topic, self._presence_payload(False), qos=1, retain=True
            ),
            tls_context=tls,
            timeout=10,
            # Commands are small and latency-bound: without TCP_NODELAY a publish can wait on
            # Nagle + delayed ACK (~85 ms a step, bench/timer.md).
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            max_inflight_messages=s.max_inflight,
            queue_type=_bounded_queue(on_overflow),
            max_queued_incoming_messages=s.inbound_queue,
        )
        client.pending_calls_threshold = s.max_inflight + 10  # a full window is normal
        return client

    def _inbound_overflow(self, message: aiomqtt.Message) -> None:
        self.m_in_dropped.labels("queue_full").inc()
        self._in_overflows += 1
        if self._in_overflows % _LOG_EVERY == 1:
            log.warning(
                "inbound queue full (%d): dropped a message on %s (%d so far)",
                self._settings.inbound_queue,
                message.topic.value,
                self._in_overflows,
            )

    def _mark_disconnected(self) -> None:
        self._connected.clear()
        self._disconnected.set()
        self.m_connected.set(0)

    async def _receive_loop(self, client: aiomqtt.Client) -> None:
        limit = self._settings.max_payload_bytes
        async for message in client.messages:
            self.m_in.inc()
            self.received += 1
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                self.m_in_dropped.labels("not_bytes").inc()
                continue
            if len(payload) > limit:
                self.m_in_dropped.labels("oversize").inc()
                log.warning(
                    "dropped %d-byte message on %s (limit %d)", len(payload), message.topic, limit
                )
                continue
            props = message.properties
            inbound = Inbound(
                topic=message.topic.value,
                payload=bytes(payload),
                qos=message.qos,
                retain=message.retain,
                received_mono=time.monotonic(),
                received_ms=time.time_ns() // 1_000_000,
                response_topic=getattr(props, "ResponseTopic", None) if props else None,
                correlation_data=getattr(props, "CorrelationData", None) if props else None,
            )
            self._dispatch(inbound)

    def _dispatch(self, inbound: Inbound) -> None:
        matched = False
        for route in self._routes:
            if aiomqtt.Topic(inbound.topic).matches(route.topic_filter):
                matched = True
                try:
                    route.handler(inbound)
                except Exception:
                    self.m_in_dropped.labels("handler_error").inc()
                    log.exception("handler for %s failed on %s", route.topic_filter, inbound.topic)
        if not matched:
            self.m_in_dropped.labels("no_route").inc()


_LOG_EVERY = 1000


def _bounded_queue(
    on_overflow: Callable[[aiomqtt.Message], None],
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """aiomqtt's inbound queue class: bounded by ``maxsize``; when full, the newest message is
    dropped and reported to ``on_overflow`` (instead of aiomqtt logging every drop)."""

    class BoundedInbound(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            if self.full():
                on_overflow(item)
                return
            super().put_nowait(item)

    return BoundedInbound


def _cancel_count() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def _honour_lost_cancel(baseline: int) -> None:
    """Re-raise a cancellation aiomqtt swallowed.

    aiomqtt awaits the broker with ``asyncio.wait_for``, which on Python 3.11 can return a
    result and drop a cancellation that raced with it; the task still counts the request in
    ``cancelling()``. Without this check a cancelled connection task carries on (and a gateway
    whose HTTP port is taken, say, never exits). Called after every awaited aiomqtt call with
    the count seen when the task began this attempt: tearing down an earlier connection can
    leave the count raised for good, so only requests beyond it are new.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling() > baseline:
        raise asyncio.CancelledError


def gateway_client_id(gateway_id: str, password: str | None) -> str:
    """The gateway's MQTT client id: ``snlpgw-{gw}-`` plus 20 hex digits nobody can guess.

    Mosquitto disconnects a client when another connects with the same id, so a guessable id
    (``snlpgw-<host>``) let any credential knock the gateway off. The suffix is an HMAC of the
    gateway id under the gateway's broker password (stable across restarts, so broker logs stay
    readable, and secret as long as the password is), or random when there is no password.
    """
    if password:
        digest = hmac.new(password.encode(), f"snlpgw-client-id:{gateway_id}".encode(), "sha256")
        suffix = digest.hexdigest()[:20]
    else:
        suffix = secrets.token_hex(10)
    return f"snlpgw-{gateway_id}-{suffix}"


def presence_payload(gateway_id: str) -> Callable[[bool], bytes]:
    """Gateway presence body (``topics.GatewayStatus``): ``{"v":1,"online",…,"ts"}``."""

    def build(online: bool) -> bytes:
        ts = time.time_ns() // 1_000_000
        return encode(GatewayStatus(online=online, gateway_id=gateway_id, ts=ts))

    return build
