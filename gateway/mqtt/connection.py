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
  ``mqtt.outbound_queue``. Publishes in flight when the connection breaks stay with the
  session (:mod:`gateway.mqtt.session`) and are sent again, with their ids, after the reconnect.
* One session lives across reconnects: with ``mqtt.session_expiry_s`` > 0 the broker keeps the
  gateway's subscriptions and queues its QoS 1 messages while it is away (Clean Start 0), so a
  board's event sent during a reconnect is delivered after it.
* A publish MQTT forbids (a wildcard, U+0000 or nothing as its topic, over the broker's Maximum
  Packet Size or ``mqtt.broker_max_packet_bytes``) is refused at :meth:`publish`, counted; a
  publish the broker refuses (PUBACK >= 0x80) or disconnects us for (the poison rule) is
  dropped, counted and alarmed, never sent again: no message can cause a reconnect loop.
* A subscription the broker refuses is alarmed and makes the gateway not ready
  (``/healthz``, ``snlpgw doctor`` name the filter); the rest keep being served.
* Inbound payloads over ``max_payload_bytes`` are dropped and counted before any parsing.
* Retained messages are delivered with ``Inbound.retain`` set; handlers of device topics
  ignore them (a device could otherwise have its events replayed at every resubscribe).
* Reconnect with capped exponential back-off and jitter; the back-off starts again only after a
  connection stayed up ``STABLE_S`` (a connection the broker ends at once keeps backing off).
  Every route is resubscribed and the retained gateway presence republished on each connect.
  The presence LWT is registered with the broker so a crash shows ``online: false``.

MQTT 5 is needed for control requests' response topic and correlation data (SPEC §3).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from gateway.backoff import BackoffPolicy, FailureStreak
from gateway.metrics import Metrics
from gateway.mqtt import codec
from gateway.mqtt import session as core
from gateway.mqtt.client import Client
from gateway.mqtt.edge import Handler, Inbound
from gateway.mqtt.links import STABLE_S, PublishLink
from gateway.mqtt.options import ClientOptions, ConnectRefused, MqttError, PublishRefused
from gateway.mqtt.outbound import Lane, Outbound, OutboundCounters, OutboundQueue, lane_for
from gateway.mqtt.tls import BrokerTls
from gateway.mqtt.topics import TopicMatcher
from gateway.settings import MqttSettings

log = logging.getLogger(__name__)
_OPS_PREFIX = "snlpgw/v1/ops/"

# A full lane logs its 1st loss, then every 100th (each is counted), not a line per publish.
_LOG_EVERY = 100
# One ops alarm per kind at most this often (each failure is counted and logged regardless).
ALARM_EVERY_S = 60.0
# PUBACK / DISCONNECT reason codes as metric labels (a fixed set; any other is "other").
_REASONS = {
    0x80: "unspecified", 0x83: "implementation_specific", 0x87: "not_authorized",
    0x90: "topic_name_invalid", 0x91: "packet_id_in_use", 0x95: "packet_too_large",
    0x97: "quota_exceeded", 0x99: "payload_format_invalid", 0x9A: "retain_not_supported",
    0x9B: "qos_not_supported",
}  # fmt: skip
AlarmSink = Callable[..., None]  # Ops.alarm(alarm, device=None, **detail)


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
        alarm: AlarmSink | None = None,
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
        self._alarm = alarm
        self._alarmed: dict[str, float] = {}  # alarm -> when last raised (ALARM_EVERY_S)
        self._refused_filters: tuple[tuple[str, int], ...] = ()
        self._last_error: str | None = None
        self._presence_refused: str | None = None
        self._session = core.MqttSession(self._client_options())
        self.connected_since: float | None = None
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
        self.m_out_failed = metrics.counter(
            "mqtt_publish_failed",
            "Publishes never delivered: refused by the broker (PUBACK >= 0x80, by reason), "
            "dropped as poison (the broker disconnected us for them) or invalid (MQTT forbids)",
            ["reason"],
        )
        self.m_fallbacks = metrics.counter(
            "mqtt_fallbacks",
            "Publishes sent below what was asked because the broker does not offer it "
            "(qos_downgraded: Maximum QoS 0; retain_dropped: Retain Available 0)",
            ["kind"],
        )
        self.m_sub_refused = metrics.gauge(
            "mqtt_subscriptions_refused", "Subscriptions the broker refused at the last connect"
        )
        self.m_reconnects = metrics.counter(
            "mqtt_connection_losses", "Broker connections lost or refused", ["how"]
        )
        # Bounded lanes (see outbound.py); presence is re-sent on every connect.
        counters = OutboundCounters(
            dropped=self._dropped,
            refused=self._refused,
            published=self.m_out.inc,
            failed=self._failed,
            invalid=self._invalid,
            fallback=lambda kind: self.m_fallbacks.labels(kind).inc(),
        )
        self._outbox = OutboundQueue(
            control_limit=settings.control_queue,
            events_limit=settings.outbound_queue,
            window=settings.max_inflight,
            counters=counters,
        )
        # Publish-only connections beside this one (links.py), each with lanes of its own; a
        # topic always goes through the same one of these outboxes (its order is kept).
        self._links = [
            PublishLink(
                settings=settings,
                options=ClientOptions(
                    client_id=f"{client_id}.p{k}",
                    keepalive_s=settings.keepalive_s,
                    username=settings.username,
                    password=password,
                ),
                counters=counters,
                tls=self._tls,
                on_message=self._on_message,
                on_change=self._links_changed,
            )
            for k in range(1, settings.publish_links + 1)
        ]
        self._outboxes = [self._outbox, *(link.outbox for link in self._links)]
        self.m_links = metrics.gauge(
            "mqtt_publish_links_connected", "Publish links connected (mqtt.publish_links)"
        )
        self.m_out_queue.set_function(  # read when scraped
            lambda: sum(len(outbox) for outbox in self._outboxes)
        )

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
        was not queued (MQTT forbids it, it is over the broker's packet limit, or the CONTROL
        lane is full), counted either way."""
        data = payload.encode() if isinstance(payload, str) else payload
        try:
            encoded = self._session.topic_bytes(topic)
            if qos not in (0, 1):
                raise core.InvalidPublish(core.Invalid.QOS_UNSUPPORTED, f"QoS {qos}")  # noqa: TRY301
        except core.InvalidPublish as exc:
            self.m_out_failed.labels("invalid").inc()
            log.error("refused a publish: %s", exc)  # noqa: TRY400 - the caller's, no trace
            return False
        # The broker disconnects a client for a packet over its limit; refuse it here (counted)
        # so one oversized message never costs the connection. Properties: at most 3 + 4 + 5.
        props = (0 if correlation_data is None else 3 + len(correlation_data)) + (
            0 if expiry_s is None else 5
        )
        limit = self.max_packet_bytes
        # 16 bytes cover the fixed header, lengths and packet id: most publishes skip the sum.
        if (
            len(data) + len(encoded) + props + 16 > limit
            and (size := codec.publish_size(len(encoded), len(data), qos=qos, properties=props))
            > limit
        ):
            self.m_out_oversize.inc()
            self.m_out_failed.labels("too_large").inc()
            log.error("dropped %d-byte publish on %s: over the broker's limit", size, topic)
            return False
        lane = lane_for(topic)
        msg = Outbound(topic, data, qos, retain, correlation_data, expiry_s, lane, on_sent)
        outboxes = self._outboxes
        if len(outboxes) == 1:
            return self._outbox.put(msg)
        return outboxes[zlib.crc32(encoded) % len(outboxes)].put(msg)

    @property
    def max_packet_bytes(self) -> int:
        """The largest packet the broker takes: what it announced, else the setting."""
        announced = self._session.limits.maximum_packet_size
        configured = self._settings.broker_max_packet_bytes
        return configured if announced is None else min(announced, configured)

    def health(self) -> dict[str, object]:
        """Readiness for /healthz: connected, and every subscription granted."""
        refused = [f for f, _ in self._refused_filters]
        links = sum(link.connected for link in self._links)
        body: dict[str, object] = {
            "ok": self.connected
            and not refused
            and self._presence_refused is None
            and links == len(self._links)
        }
        if self._links:
            body["publish_links"] = f"{links}/{len(self._links)} connected"
        if refused:
            body["refused_subscriptions"] = refused
        if self._presence_refused is not None:
            body["presence_refused"] = self._presence_refused
        if not self.connected and self._last_error is not None:
            body["error"] = self._last_error
        return body

    @property
    def refused_subscriptions(self) -> tuple[tuple[str, int], ...]:
        """(filter, reason code) of each subscription refused at the last connect."""
        return self._refused_filters

    def _failed(self, msg: Outbound, event: core.Failed) -> None:
        reason = "poison" if event.failure is core.Failure.POISON else "refused"
        code = _REASONS.get(event.reason, "other")
        self.m_out_failed.labels(reason if reason == "poison" else f"refused_{code}").inc()
        log.error(
            "publish on %s %s by the broker (reason code 0x%02x, %s): dropped, not resent",
            msg.topic,
            "dropped as poison: disconnected" if reason == "poison" else "refused",
            event.reason,
            code,
        )
        if not msg.topic.startswith(_OPS_PREFIX):  # an alarm about an alarm could loop
            self._raise(f"mqtt_publish_{reason}", topic=msg.topic[:200], reason_code=event.reason)

    def _invalid(self, msg: Outbound, exc: core.InvalidPublish) -> None:
        label = "too_large" if exc.reason is core.Invalid.TOO_LARGE else "invalid"
        self.m_out_failed.labels(label).inc()
        log.error("dropped a publish on %s: %s", msg.topic[:200], exc)

    def _raise(self, alarm: str, **detail: object) -> None:
        now = time.monotonic()
        last = self._alarmed.get(alarm)
        if self._alarm is None or (last is not None and now - last < ALARM_EVERY_S):
            return
        self._alarmed[alarm] = now
        self._alarm(alarm, **detail)

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
        """Connect, serve, reconnect (each publish link too); returns only when cancelled."""
        if not self._links:
            await self._run_main()
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._run_main(), name="mqtt.main")
            for link in self._links:
                tg.create_task(link.run(), name=f"mqtt.{link.client_id[-3:]}")

    def _links_changed(self) -> None:
        self.m_links.set(sum(link.connected for link in self._links))

    async def _run_main(self) -> None:
        while True:
            try:
                await self._serve_once()
            except MqttError as exc:
                self._mark_disconnected()
                self._last_error = str(exc)
                since = self.connected_since
                if since is not None and time.monotonic() - since >= STABLE_S:
                    self._backoff.reset()  # it held: the next failure starts from the minimum
                self.connected_since = None
                delay = self._backoff.failed()
                self._log_loss(exc, delay)
                await asyncio.sleep(delay)

    def _log_loss(self, exc: MqttError, delay: float) -> None:
        if isinstance(exc, ConnectRefused):
            self.m_reconnects.labels("refused").inc()
            if exc.bad_credentials:
                log.error(
                    "%s: the broker does not accept user %r with the gateway password "
                    "(set mqtt.password or mqtt.password_file to the broker's gateway secret, "
                    "SNLPGW_MQTT__PASSWORD / SNLPGW_MQTT__PASSWORD_FILE); reconnecting in %.2fs",
                    exc,
                    self._settings.username,
                    delay,
                )
                return
            log.error("%s; reconnecting in %.2fs", exc, delay)
            return
        self.m_reconnects.labels("lost").inc()
        log.warning("broker connection lost (%s); reconnecting in %.2fs", exc, delay)

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
            limits = await client.connect(s.host, s.port, tls=tls, wait_s=10)
        except MqttError as exc:  # a TLS failure is said as the setting to fix (and counted)
            if (tls_error := self._tls.failure(exc)) is None:
                raise
            raise tls_error from exc
        self._client = client
        self.connected_since = time.monotonic()
        try:
            await self._subscribe(client, limits)
            await client.settled()  # the previous connection's suspects first (poison rule)
            await self._announce(client)
            self._connections += 1
            self.m_connects.inc()
            self.m_connected.set(1)
            self._connected.set()
            self._disconnected.clear()
            self._last_error = None
            log.info(
                "connected to broker %s as %s (session %s, keep-alive %ds)",
                s.url,
                s.username,
                "resumed" if limits.session_present else "new",
                limits.keepalive_s,
            )
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._outbox.pump(client), name="mqtt.publish")
                tg.create_task(client.closed(), name="mqtt.closed")
        except* MqttError as group:
            raise group.exceptions[0] from None
        finally:
            self._client = None
            await client.disconnect(wait_s=1.0)

    async def _announce(self, client: Client) -> None:
        """The retained presence, once per connection. A broker that refuses it (its ACL, a
        quota) is alarmed and makes the gateway not ready, and the connection is served anyway:
        reconnecting would only be refused again."""
        try:
            sent = await client.publish_wait(
                self._presence_topic, self._presence_payload(True), qos=1, retain=True
            )
        except PublishRefused as exc:
            self._presence_refused = str(exc)
            self.m_out_failed.labels("refused_presence").inc()
            log.error("%s: the gateway's presence is not announced (check the broker's ACL)", exc)  # noqa: TRY400
            self._raise("mqtt_publish_refused", topic=self._presence_topic, reason_code=exc.reason)
            return
        self._presence_refused = None
        if sent.qos_downgraded:  # the presence skips the lanes, which count the rest
            self.m_fallbacks.labels("qos_downgraded").inc()
        if sent.retain_dropped:
            self.m_fallbacks.labels("retain_dropped").inc()

    async def _subscribe(self, client: Client, limits: core.Limits) -> None:
        filters = [(r.topic_filter, r.qos) for r in self._routes]
        if not filters:
            return
        codes = await client.subscribe(filters)
        refused = tuple((f, c) for (f, _), c in zip(filters, codes, strict=False) if c >= 0x80)
        self._refused_filters = refused
        self.m_sub_refused.set(len(refused))
        for topic_filter, code in refused:
            log.error(
                "the broker refused the subscription %s (reason code 0x%02x): the gateway "
                "hears nothing on it and reports not ready (check the broker's ACL for %r)",
                topic_filter,
                code,
                self._settings.username,
            )
        if refused:
            self._raise(
                "mqtt_subscribe_refused",
                filters=[f for f, _ in refused][:20],
                reason_codes=[c for _, c in refused][:20],
            )
        if limits.maximum_qos < max(q for _, q in filters):
            self.m_fallbacks.labels("qos_downgraded").inc()
            log.warning(
                "the broker offers QoS %d only: subscriptions downgraded", limits.maximum_qos
            )

    def _client_options(self) -> ClientOptions:
        s = self._settings
        will = codec.Will(self._presence_topic, self._presence_payload(False), qos=1, retain=True)
        return ClientOptions(
            client_id=self._client_id,
            keepalive_s=s.keepalive_s,
            username=s.username,
            password=self._password,
            will=will,
            session_expiry_s=s.session_expiry_s,
        )

    def _make_client(self) -> Client:
        self._session.options = self._client_options()  # the will's presence: a fresh ts
        return Client(self._session.options, self._on_message, session=self._session)

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
