"""Gateway → ops payloads: metrics snapshot, alarms, and the gateway's own presence."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, JsonValue

from topics.tree import DEVICE_ID_RE, GATEWAY_ID_RE
from topics.wire import EpochMs, OwnModel

__all__ = ["Alarm", "GatewayStatus", "OpsEvent", "OpsMetrics"]

GatewayId = Annotated[str, Field(pattern=f"^{GATEWAY_ID_RE.pattern}$")]


class Alarm(StrEnum):
    """Alarms known today; the wire field is an open snake_case name so new ones need no bump."""

    ACK_TIMEOUT = "ack_timeout"
    COMMAND_EXPIRED = "command_expired"
    DEVICE_FLAPPING = "device_flapping"
    QUEUE_OVERFLOW = "queue_overflow"
    ASR_DROPPED = "asr_dropped"
    STORE_FAILED = "store_failed"
    MANAGER_FAILED = "manager_failed"
    CHAT_UPSTREAM_LOST = "chat_upstream_lost"
    MQTT_PUBLISH_REFUSED = "mqtt_publish_refused"
    MQTT_PUBLISH_POISON = "mqtt_publish_poison"
    MQTT_SUBSCRIBE_REFUSED = "mqtt_subscribe_refused"
    ARCHIVE_OVERFLOW = "archive_overflow"
    ARCHIVE_FAILED = "archive_failed"
    VOICE_OVERLOAD = "voice_overload"


class OpsMetrics(OwnModel):
    """Retained snapshot on `snlpgw/v1/ops/{gw}/metrics` (flat `Metrics.snapshot()` map)."""

    v: Literal[1] = 1
    gateway_id: GatewayId
    ts: EpochMs
    interval_s: Annotated[float, Field(gt=0)]
    metrics: dict[str, Annotated[float, Field(allow_inf_nan=False)]]

    @classmethod
    def from_snapshot(
        cls, snapshot: Mapping[str, float], *, gateway_id: str, ts: int, interval_s: float
    ) -> OpsMetrics:
        """Drop non-finite samples (JSON has no NaN/Inf) and sort keys for stable output."""
        finite = {k: float(v) for k, v in sorted(snapshot.items()) if math.isfinite(v)}
        return cls(gateway_id=gateway_id, ts=ts, interval_s=interval_s, metrics=finite)


class OpsEvent(OwnModel):
    """An alarm on `snlpgw/v1/ops/{gw}/events`."""

    v: Literal[1] = 1
    gateway_id: GatewayId
    ts: EpochMs
    alarm: Annotated[
        str,
        Field(pattern=r"^[a-z][a-z0-9_]{0,63}$", examples=[a.value for a in Alarm]),
    ]
    device: Annotated[str, Field(pattern=f"^{DEVICE_ID_RE.pattern}$")] | None = None
    detail: dict[str, JsonValue] = Field(default_factory=dict)


class GatewayStatus(OwnModel):
    """Retained gateway presence (+ LWT) on `snlpgw/v1/gw/{gw}/status`."""

    v: Literal[1] = 1
    online: bool
    gateway_id: GatewayId
    ts: EpochMs
    udp: (
        Annotated[
            str,
            Field(
                max_length=262,
                pattern=r"^[A-Za-z0-9.:\[\]_-]+:[0-9]{1,5}$",
                description="The gateway's announced UDP audio endpoint `host:port` "
                "(udp.public_host/public_port); the hello reply of the device's owner names it.",
            ),
        ]
        | None
    ) = None
