"""Publish links: more broker connections for the gateway's publishes (``mqtt.publish_links``).

Why: every connection's QoS 1 publishes in flight are capped by the broker's Receive Maximum
(Mosquitto's ``max_inflight_messages``, 20, broker-wide: raising it would also raise what each
board may hold half-done in QoS 2), so one connection publishes at most ~20 messages per round
trip, and under load a round trip is a turn of the gateway's loop. At 1,000 speaking lessons
the gateway publishes ~3,500 QoS 1 messages a second (board commands and task events), and
board commands waited seconds for a slot. Each link is one more window of the same size.

A link is publish-only: its own MQTT session (Clean Start, nothing kept by the broker, no
will, no subscriptions: presence and every subscription stay on the main connection) with its
own outbound lanes (:mod:`outbound`: the same bounds, policies and counters as the main
connection's). :class:`~gateway.mqtt.connection.MqttConnection` hands each publish to the
connection its topic hashes to, so one topic always leaves on one connection and the broker
forwards its messages in the order they were published (MQTT 5 §4.6): a board's LISTEN_STOP
and its next PLAY_MEDIA still arrive in order. A link that drops keeps its queue and what was in
flight (sent again after its reconnect, as on the main connection) and reconnects with the same
back-off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.backoff import BackoffPolicy, FailureStreak
from gateway.mqtt import codec
from gateway.mqtt import session as core
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions, MqttError
from gateway.mqtt.outbound import OutboundCounters, OutboundQueue
from gateway.mqtt.tls import BrokerTls
from gateway.settings import MqttSettings

log = logging.getLogger(__name__)

# A connection that stayed up this long starts the reconnect back-off again from its minimum.
STABLE_S = 10.0


class PublishLink:
    def __init__(
        self,
        *,
        settings: MqttSettings,
        options: ClientOptions,
        counters: OutboundCounters,
        tls: BrokerTls,
        on_message: Callable[[codec.PublishPacket], None],
        on_change: Callable[[], None],
    ) -> None:
        self.client_id = options.client_id
        self.session = core.MqttSession(options)
        self.outbox = OutboundQueue(
            control_limit=settings.control_queue,
            events_limit=settings.outbound_queue,
            window=settings.max_inflight,
            counters=counters,
        )
        self.connected = False
        self.last_error: str | None = None
        self._settings = settings
        self._tls = tls
        self._on_message = on_message  # nothing is subscribed; a stray message is counted there
        self._on_change = on_change
        self._backoff = FailureStreak(
            BackoffPolicy(settings.reconnect_min_s, settings.reconnect_max_s, jitter=True)
        )
        self._since: float | None = None

    async def run(self) -> None:
        """Connect, publish, reconnect; returns only when cancelled."""
        while True:
            try:
                await self._serve_once()
            except MqttError as exc:
                self.last_error = str(exc)
                if self._since is not None and time.monotonic() - self._since >= STABLE_S:
                    self._backoff.reset()
                self._since = None
                delay = self._backoff.failed()
                log.warning(
                    "publish link %s: %s; reconnecting in %.2fs", self.client_id, exc, delay
                )
                await asyncio.sleep(delay)

    async def _serve_once(self) -> None:
        client = Client(self.session.options, self._on_message, session=self.session)
        s = self._settings
        tls = await self._tls.context()
        try:
            await client.connect(s.host, s.port, tls=tls, wait_s=10)
        except MqttError as exc:
            if (tls_error := self._tls.failure(exc)) is None:
                raise
            raise tls_error from exc
        self._since = time.monotonic()
        try:
            await client.settled()  # the previous connection's suspects first (poison rule)
            self.connected, self.last_error = True, None
            self._on_change()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.outbox.pump(client), name="mqtt.link-publish")
                tg.create_task(client.closed(), name="mqtt.link-closed")
        except* MqttError as group:
            raise group.exceptions[0] from None
        finally:
            if self.connected:
                self.connected = False
                self._on_change()
            await client.disconnect(wait_s=1.0)
