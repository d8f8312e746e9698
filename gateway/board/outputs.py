"""What the board channel tells the outside world: MQTT publishes, ops alarms and metrics.

One place for every side effect of the cores' decisions, so ``channel`` only routes and keeps
state. QoS and retain come from the contract (``topics.tree.DELIVERY``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from gateway.board import wire
from gateway.board.metrics import BoardMetrics
from gateway.board.model import AckStatus, Envelope, Outcome, OutcomeKind
from gateway.board.presence import Flapping
from gateway.mqtt.edge import Inbound, Publisher
from topics.errors import excerpt
from topics.tree import DELIVERY, TopicKind, build_topic

log = logging.getLogger(__name__)

_ACKED = frozenset(
    {OutcomeKind.ACCEPTED, OutcomeKind.DUPLICATE, OutcomeKind.REJECTED, OutcomeKind.BUSY}
)
_ALARMS = {
    OutcomeKind.EXPIRED: "command_expired",
    OutcomeKind.FAILED: "ack_timeout",
    OutcomeKind.OVERFLOW: "queue_overflow",
}


_LOG_EVERY = 100


class Alarms(Protocol):
    def alarm(self, alarm: str, *, device: str | None = None, **detail: object) -> None: ...


class BoardOutputs:
    def __init__(
        self,
        *,
        publisher: Publisher,
        alarms: Alarms,
        metrics: BoardMetrics,
        wall_ms: Callable[[], int],
    ) -> None:
        self.publisher = publisher
        self.alarms = alarms
        self.m = metrics
        self._wall_ms = wall_ms
        # Bounded by the finite sets of topic kinds and drop reasons.
        self._drops: dict[tuple[str, str], int] = {}

    def command(
        self, dev: str, envelope: Envelope, *, resend: bool, on_sent: Callable[[], None]
    ) -> None:
        """Publish a command; ``on_sent`` runs when it leaves the gateway (its ack deadline)."""
        (self.m.resent if resend else self.m.sent).labels(envelope.name).inc()
        self._publish(TopicKind.CMD, dev, envelope.payload, on_sent)

    def outcome(self, dev: str, outcome: Outcome) -> None:
        name, kind = outcome.command, outcome.kind
        if outcome.ack_latency_s is not None:
            self.m.ack_latency.labels(name).observe(outcome.ack_latency_s)
        if kind in _ACKED:
            self.m.acked.labels(name, AckStatus(kind.value).value).inc()
        elif kind is OutcomeKind.EXPIRED:
            self.m.expired.labels(name).inc()
        else:
            self.m.failed.labels(name, "no_ack" if kind is OutcomeKind.FAILED else kind.value).inc()
        alarm = _ALARMS.get(kind)
        if alarm is not None:
            self.alarms.alarm(alarm, device=dev, cmd=name, id=outcome.id, sends=outcome.sends)

    def presence(self, dev: str, *, online: bool, reason: str, online_count: int) -> None:
        """Count, write the retained status unless the board wrote it, tell the backend."""
        self.m.presence_changes.labels(str(online).lower(), reason).inc()
        self.m.online.set(online_count)
        ts = self._wall_ms()
        if reason not in ("status", "lwt"):  # a board-written status is already retained
            self.m.status_writes.inc()
            self._publish(TopicKind.STATUS, dev, wire.status_payload(online, ts_ms=ts))
        self._publish(TopicKind.TASK, dev, wire.presence_task_event(dev, online, ts_ms=ts))

    def flapping(self, flap: Flapping) -> None:
        self.alarms.alarm(
            "device_flapping", device=flap.dev, changes=flap.changes, window_s=flap.window_s
        )

    def dropped(self, kind: str, reason: str, msg: Inbound, exc: Exception | None) -> None:
        """Count every drop; log the first of each (kind, reason) and then every 100th."""
        self.m.dropped.labels(kind, reason).inc()
        seen = self._drops.get((kind, reason), 0)
        self._drops[(kind, reason)] = seen + 1
        if seen % _LOG_EVERY == 0:
            log.warning(
                "dropped board message on %s (%s, %d so far): %s payload=%s",
                excerpt(msg.topic, 80),
                reason,
                seen + 1,
                exc,
                excerpt(msg.payload, 80),
            )

    def _publish(
        self, kind: TopicKind, dev: str, payload: bytes, on_sent: Callable[[], None] | None = None
    ) -> None:
        delivery = DELIVERY[kind]
        accepted = self.publisher.publish(
            build_topic(kind, dev=dev),
            payload,
            qos=delivery.qos,
            retain=delivery.retain,
            on_sent=on_sent,
        )
        if accepted is False and on_sent is not None:
            on_sent()  # refused (counted by the connection): the ack deadline retries it
