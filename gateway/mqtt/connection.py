"""The gateway's broker connection, owned by the service: one MQTT 5 client (client.py).
Components see it through :mod:`gateway.mqtt.edge` (``Inbound``, ``Handler``, ``Publisher``).

Components never touch the client. They register routes (topic filter → handler) before the
service starts and call :meth:`MqttConnection.publish`, which never blocks and never raises:

* Handlers are plain functions run on the loop as messages are read; they must only parse and
  enqueue (a handler that raises is logged with the topic and counted; the connection goes on).
  A flood waits in the kernel and then in the broker (TCP flow control), not in the gateway.
* Publishes go through two bounded lanes (:mod:`gateway.mqtt.outbound`), drained while
  connected, ``mqtt.max_inflight`` QoS 1 publishes at a time, control first, each lane in
  order, and kept while the broker is away. CONTROL (board commands, replies, presence) is
  never dropped: when ``mqtt.control_queue`` is full the newest is refused and counted;
  EVENTS (task events, assessment results, ops) drop the oldest, counted, past
  ``mqtt.outbound_queue``. Publishes in flight when the connection breaks are put back at the
  head of their lane, in order.
* Inbound payloads over ``max_payload_bytes`` are dropped and counted before any parsing.
* A publish bigger than the broker's ``max_packet_size`` is dropped and counted: the broker
  would disconnect the gateway for it.
* Retained messages are delivered with ``Inbound.retain`` set; handlers of device topics
  ignore them (a device could otherwise have its events replayed at every resubscribe).
* Reconnect with capped exponential back-off and jitter; every route is resubscribed and the
  retained gateway presence republished on each connect. The presence LWT is registered with
  the broker so a crash shows ``online: false``.

MQTT 5 is needed for control requests' response topic and correlation data (SPEC §3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.backoff import BackoffPolicy, FailureStreak
from gateway.metrics import Metrics
from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.edge import Handler, Inbound
from gateway.mqtt.options import ClientOptions, MqttError
from gateway.mqtt.outbound import Lane, Outbound, OutboundCounters, OutboundQueue, lane_for
from gateway.mqtt.tls import BrokerTls
from gateway.mqtt.topics import TopicMatcher
from gateway.settings import MqttSettings

log = logging.getLogger(__name__)

# A full lane logs its 1st loss, then every 100th (each is counted), not a line per publish.
_LOG_EVERY = 100


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
        self._matcher = TopicMatcher()
        self._connected = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()
        self._connections = 0
        self.received = 0  # messages dispatched (tests wait on this)
        self._backoff = FailureStreak(
            BackoffPolicy(settings.reconnect_min_s, settings.reconnect_max_s, jitter=True)
        )
        self._client: Client | None = None
        self._lost = {Lane.EVENTS: 0, Lane.CONTROL: 0}  # publishes lost per lane, for the log
        self._tls = BrokerTls(settings, metrics)  # mqtts://: a context per connect (tls.py)

        self.m_connected = metrics.gauge("mqtt_connected", "1 while connected to the broker")
        self.m_connects = metrics.counter("mqtt_connects", "Successful broker connections")
        self.m_in = metrics.counter("mqtt_messages_in", "Messages received")
        self.m_in_dropped = metrics.counter(
            "mqtt_messages_in_dropped", "Inbound messages dropped", ["reason"]
        )
        self._in_oversize = self.m_in_dropped.labels("oversize")
        self._in_no_route = self.m_in_dropped.labels("no_route")
        self._in_handler_error = self.m_in_dropped.labels("handler_error")
        self.m_out = metrics.counter("mqtt_messages_out", "Messages published")
        self.m_out_dropped = metrics.counter(
            "mqtt_messages_out_dropped", "Outbound events dropped (EVENTS lane full: oldest)"
        )
        self.m_out_refused = metrics.counter(
            "mqtt_messages_out_refused", "Outbound control refused (CONTROL lane full: newest)"
        )
        self.m_out_queue = metrics.gauge("mqtt_outbound_queue", "Publishes waiting for the broker")
        self.m_out_oversize = metrics.counter(
            "mqtt_messages_out_oversize",
            "Publishes dropped as bigger than the broker's max_packet_size",
        )
        # Bounded lanes (see outbound.py); presence is re-sent on every connect.
        self._outbox = OutboundQueue(
            control_limit=settings.control_queue,
            events_limit=settings.outbound_queue,
            window=settings.max_inflight,
            counters=OutboundCounters(
                dropped=self._dropped,
                refused=self._refused,
                published=self.m_out.inc,
            ),
        )
        self.m_out_queue.set_function(lambda: len(self._outbox))  # read when scraped

    # -- component API ---------------------------------------------------------------------

    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None:
        """Register a subscription; restored on every (re)connect."""
        self._routes.append(_Route(topic_filter, handler, qos))
        self._matcher.add(topic_filter, len(self._routes) - 1)

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
        on_sent: Callable[[], None] | None = None,
    ) -> bool:
        """Queue a publish in its lane (from the topic, :func:`lane_for`); ``False`` when it
        was not queued (oversize, or the CONTROL lane full), counted either way."""
        data = payload.encode() if isinstance(payload, str) else payload
        # The broker disconnects a client for a packet over its max_packet_size; refuse it here
        # (counted) so one oversized message never costs the connection. 256 bytes cover the
        # fixed header and properties.
        if len(data) + len(topic) * 4 + 256 > self._settings.broker_max_packet_bytes:
            self.m_out_oversize.inc()
            log.error("dropped %d-byte publish on %s: over the broker's limit", len(data), topic)
            return False
        lane = lane_for(topic)
        msg = Outbound(topic, data, qos, retain, correlation_data, expiry_s, lane, on_sent)
        return self._outbox.put(msg)

    def _dropped(self, msg: Outbound) -> None:
        self.m_out_dropped.inc()
        self._lost[Lane.EVENTS] += 1
        if (seen := self._lost[Lane.EVENTS]) % _LOG_EVERY == 1:
            log.warning(
                "outbound events lane full: dropped oldest publish on %s (%d so far)",
                msg.topic,
                seen,
            )

    def _refused(self, msg: Outbound) -> None:
        self.m_out_refused.inc()
        self._lost[Lane.CONTROL] += 1
        if (seen := self._lost[Lane.CONTROL]) % _LOG_EVERY == 1:
            log.error(
                "outbound control lane full: refused publish on %s (%d so far)", msg.topic, seen
            )

    # -- service task ----------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect; returns only when cancelled."""
        while True:
            try:
                await self._serve_once()
            except MqttError as exc:
                self._mark_disconnected()
                delay = self._backoff.failed()
                log.warning("broker connection lost (%s); reconnecting in %.2fs", exc, delay)
                await asyncio.sleep(delay)

    async def close(self, grace_s: float) -> None:
        """Announce ``online: false`` and disconnect cleanly (no LWT); bounded by ``grace_s``."""
        client = self._client
        if client is None or not self.connected:
            return
        try:
            async with asyncio.timeout(grace_s):
                await client.publish_wait(
                    self._presence_topic, self._presence_payload(False), qos=1, retain=True
                )
        except (MqttError, TimeoutError):
            return

    async def _serve_once(self) -> None:
        client = self._make_client()
        s = self._settings
        tls = await self._tls.context()  # None for mqtt://; a TLS file unusable: TlsSetupError
        try:
            await client.connect(s.host, s.port, tls=tls, wait_s=10)
        except MqttError as exc:  # a TLS failure is said as the setting to fix (and counted)
            if (tls_error := self._tls.failure(exc)) is None:
                raise
            raise tls_error from exc
        self._client = client
        try:
            filters = [(r.topic_filter, r.qos) for r in self._routes]
            if filters:
                await client.subscribe(filters)
            await client.publish_wait(
                self._presence_topic, self._presence_payload(True), qos=1, retain=True
            )
            self._connections += 1
            self.m_connects.inc()
            self.m_connected.set(1)
            self._connected.set()
            self._disconnected.clear()
            self._backoff.reset()
            log.info("connected to broker %s as %s", s.url, s.username)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._outbox.pump(client), name="mqtt.publish")
                tg.create_task(client.closed(), name="mqtt.closed")
        except* MqttError as group:
            raise group.exceptions[0] from None
        finally:
            self._client = None
            await client.disconnect(wait_s=1.0)

    def _make_client(self) -> Client:
        s = self._settings
        will = codec.Will(self._presence_topic, self._presence_payload(False), qos=1, retain=True)
        options = ClientOptions(
            client_id=self._client_id,
            keepalive_s=s.keepalive_s,
            username=s.username,
            password=self._password,
            will=will,
        )
        return Client(options, self._on_message)

    def _mark_disconnected(self) -> None:
        self._connected.clear()
        self._disconnected.set()
        self.m_connected.set(0)

    def _on_message(self, message: codec.PublishPacket) -> None:
        self.m_in.inc()
        self.received += 1
        payload = message.payload
        if len(payload) > self._settings.max_payload_bytes:
            self._in_oversize.inc()
            log.warning(
                "dropped %d-byte message on %s (limit %d)",
                len(payload),
                message.topic,
                self._settings.max_payload_bytes,
            )
            return
        inbound = Inbound(
            message.topic,
            payload,
            message.qos,
            message.retain,
            time.monotonic(),
            time.time_ns() // 1_000_000,
            message.response_topic,
            message.correlation_data,
        )
        self._dispatch(inbound)

    def _dispatch(self, inbound: Inbound) -> None:
        matched = False
        for index in self._matcher.match(inbound.topic):
            matched = True
            route = self._routes[index]
            try:
                route.handler(inbound)
            except Exception:
                self._in_handler_error.inc()
                log.exception("handler for %s failed on %s", route.topic_filter, inbound.topic)
        if not matched:
            self._in_no_route.inc()
