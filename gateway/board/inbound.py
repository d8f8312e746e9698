"""The board channel's uplink handler: ``snlp/v1/+/ack|rpt|evt|hb|status`` parsed, checked and
applied to the device table. Handlers only parse and update state; nothing here awaits, and
bad input is a counted drop, never an exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway import labels
from gateway.board import wire
from gateway.board.device import Device
from gateway.board.model import BoardAck, BoardEvent, BoardHeartbeat, BoardReport, OnlineStatus
from gateway.board.table import BoardTable
from gateway.mqtt.edge import Inbound
from topics.errors import PayloadError, TopicError, excerpt
from topics.tree import TopicKind, parse_topic

log = logging.getLogger(__name__)

UPLINK_KINDS = (TopicKind.ACK, TopicKind.RPT, TopicKind.EVT, TopicKind.HB, TopicKind.STATUS)
PRESENCE_KINDS = (TopicKind.HB, TopicKind.STATUS)  # read by every gateway, owner or not


class BoardUplink:
    def __init__(
        self, *, table: BoardTable, max_payload_bytes: int, clock: Callable[[], float]
    ) -> None:
        self._table = table
        self._max_payload = max_payload_bytes
        self._clock = clock

    def handle(self, msg: Inbound) -> None:
        """Route handler for every board uplink topic; never raises for bad input."""
        table = self._table
        try:
            topic = parse_topic(msg.topic)
        except TopicError as exc:
            self._drop("unknown", "bad_topic", msg, exc)
            return
        if topic.kind not in UPLINK_KINDS or topic.dev is None:
            self._drop(topic.kind.value, "not_uplink", msg, None)
            return
        if msg.retain and topic.kind is not TopicKind.STATUS:
            # A retained ack/rpt/evt/hb would be replayed at every (re)subscribe; only the
            # retained status means something (presence, SPEC §3).
            self._drop(topic.kind.value, "retained", msg, None)
            return
        if topic.kind not in PRESENCE_KINDS and not table.owns(topic.dev):
            # Another gateway's device (scale-out): its presence is kept, its payload is the
            # owner's to read. Left before the parse: every gateway receives every board's
            # uplink, so this path runs for (gateways - 1) of every N messages.
            self._foreign(topic.kind, topic.dev, msg)
            return
        try:
            parsed = wire.parse(topic.kind, msg.payload, max_bytes=self._max_payload)
        except PayloadError as exc:
            self._drop(topic.kind.value, exc.reason.value, msg, exc)
            return
        device = table.device(topic.dev)
        if device is None:
            self._drop(topic.kind.value, "too_many_devices", msg, None)
            return
        now = self._clock()
        match parsed:
            case OnlineStatus():
                self._on_status(device, parsed, now)
            case BoardHeartbeat():
                if device.note_heartbeat(parsed, now):
                    device.new_session()
                table.presence(device, device.presence.on_heartbeat(now))
            case BoardAck():  # resolve first: a board coming back must not get a needless resend
                self._on_ack(device, parsed, now)
                table.presence(device, device.presence.on_activity(now))
            case BoardReport():
                table.presence(device, device.presence.on_activity(now))
                self._on_report(device, parsed)
            case _:
                table.presence(device, device.presence.on_activity(now))
                self._on_event(device, parsed, msg)
        table.reschedule(device)

    def _foreign(self, kind: TopicKind, dev: str, msg: Inbound) -> None:
        """An ack, report or event of a device another gateway owns: activity for its
        presence, counted ``not_owner``; the payload is not read (the owner reads it)."""
        table = self._table
        device = table.device(dev)
        if device is None:
            self._drop(kind.value, "too_many_devices", msg, None)
            return
        table.presence(device, device.presence.on_activity(self._clock()))
        table.out.m.dropped.labels(kind.value, "not_owner").inc()  # normal: counted
        table.reschedule(device)

    def _on_status(self, device: Device, status: OnlineStatus, now: float) -> None:
        if not status.by_gateway and device.note_session(status.session):
            device.new_session()
        self._table.presence(device, device.presence.on_status(status, now))

    def _on_ack(self, device: Device, ack: BoardAck, now: float) -> None:
        effects = device.outbox.on_ack(ack, now)
        if effects is None:
            self._table.out.m.unmatched.labels("ack").inc()
            log.info("board %s: ack for no pending command %s", device.dev, excerpt(ack.ref, 40))
            return
        self._table.apply(device, effects, reschedule=False)  # handle() reschedules at its end

    def _on_report(self, device: Device, report: BoardReport) -> None:
        m = self._table.out.m
        m_cmd = labels.bounded(report.cmd, labels.COMMANDS)
        m.reports.labels(m_cmd, labels.bounded(report.stage, labels.REPORT_STAGES)).inc()
        download = device.downloads.get(report.ref)
        if download is None:
            m.unmatched.labels("rpt").inc()
            return
        if not report.final:
            if download.on_progress is not None:
                download.on_progress(report)
            return
        del device.downloads[report.ref]
        if not download.result.done():
            download.result.set_result(report)

    def _on_event(self, device: Device, parsed: wire.ParsedEvent, msg: Inbound) -> None:
        evt = getattr(parsed.body, "kind", None) or getattr(parsed.body, "evt", "button")
        self._table.out.m.events.labels(
            labels.board_event(evt), "legacy" if parsed.legacy else "structured"
        ).inc()
        event = BoardEvent(
            dev=device.dev,
            body=parsed.body,
            ref=parsed.ref,
            id=parsed.id,
            board_ts_ms=parsed.ts_ms,
            received_ms=msg.received_ms,
            received_mono=msg.received_mono,
            legacy=parsed.legacy,
        )
        self._table.sink.board_event(event)

    def _drop(self, kind: str, reason: str, msg: Inbound, exc: Exception | None) -> None:
        self._table.out.dropped(kind, reason, msg, exc)
