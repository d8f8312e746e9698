"""The board channel's figures (names get the registry's ``snlpgw_`` prefix)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from gateway.metrics import Metrics

_ACK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class BoardMetrics:
    sent: Counter
    resent: Counter
    acked: Counter
    expired: Counter
    failed: Counter
    ack_latency: Histogram
    events: Counter
    reports: Counter
    dropped: Counter
    unmatched: Counter
    online: Gauge
    tracked: Gauge
    evicted: Counter
    presence_changes: Counter
    status_writes: Counter

    @classmethod
    def create(cls, m: Metrics) -> BoardMetrics:
        return cls(
            sent=m.counter("board_commands_sent", "Commands sent to boards (first sends)", ["cmd"]),
            resent=m.counter("board_commands_resent", "Commands resent (same id)", ["cmd"]),
            acked=m.counter("board_commands_acked", "Commands acked", ["cmd", "status"]),
            expired=m.counter("board_commands_expired", "Commands whose ttl passed", ["cmd"]),
            failed=m.counter(
                "board_commands_failed",
                "Commands that ended without an ack (no_ack, overflow, cancelled)",
                ["cmd", "reason"],
            ),
            ack_latency=m.histogram(
                "board_ack_latency_seconds",
                "First send to ack",
                ["cmd"],
                buckets=_ACK_BUCKETS,
            ),
            events=m.counter("board_events", "Board events", ["evt", "form"]),
            reports=m.counter("board_reports", "Board reports", ["cmd", "stage"]),
            dropped=m.counter(
                "board_inbound_dropped", "Board messages dropped", ["kind", "reason"]
            ),
            unmatched=m.counter(
                "board_inbound_unmatched", "Acks/reports for no pending command", ["kind"]
            ),
            online=m.gauge("board_devices_online", "Boards online"),
            tracked=m.gauge("board_devices_tracked", "Boards tracked by the channel"),
            evicted=m.counter(
                "board_devices_evicted", "Boards with nothing pending forgotten to make room"
            ),
            presence_changes=m.counter(
                "board_presence_changes", "Board presence changes", ["online", "reason"]
            ),
            status_writes=m.counter(
                "board_status_writes", "Retained board statuses written by the gateway"
            ),
        )
