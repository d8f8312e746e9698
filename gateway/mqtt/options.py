"""What a client connection to the broker is opened with (:class:`ClientOptions`) and how it
fails (:class:`MqttError`, :class:`ConnectRefused`). The session that keeps them is
:mod:`gateway.mqtt.session`; the connection itself is :mod:`gateway.mqtt.client`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.mqtt import codec

# The largest packet this client accepts, announced in CONNECT (Maximum Packet Size): the
# broker then never sends a bigger one (it drops it for us), so a legal large message on a
# subscribed topic cannot end the connection. Inbound payloads the gateway handles are far
# smaller (mqtt.max_payload_bytes); bigger ones up to this are counted and dropped.
MAX_INBOUND_PACKET = 1 << 20

# CONNACK reason codes worth a word of their own in a log line (MQTT 5 §3.2.2.2).
_CONNACK_REASONS = {
    0x80: "unspecified error",
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x88: "server unavailable",
    0x89: "server busy",
    0x8A: "banned",
    0x95: "packet too large",
    0x97: "quota exceeded",
    0x9A: "retain not supported",
    0x9B: "QoS not supported",
    0x9C: "use another server",
    0x9F: "connection rate exceeded",
    # MQTT 3.1.1 return codes, as a 3.1.1 broker sends them.
    0x04: "bad user name or password",
    0x05: "not authorized",
}


class MqttError(Exception):
    """The connection failed, was refused or was lost."""


class ConnectRefused(MqttError):
    def __init__(self, reason: int, reason_string: str | None = None) -> None:
        name = _CONNACK_REASONS.get(reason, "refused")
        said = f": {reason_string[:200]}" if reason_string else ""
        super().__init__(f"broker refused the connection: {name} (reason code {reason}){said}")
        self.reason = reason

    @property
    def bad_credentials(self) -> bool:
        return self.reason in (0x86, 0x87, 0x04, 0x05)


class ClosedBeforeConnack(MqttError):
    """The broker ended the connection after it was made (for TLS: after the handshake) and
    before its CONNACK. Over TLS 1.3 that is how a listener refuses a missing or untrusted
    client certificate: its alert and its close race, and the close may come first."""


class PublishRefused(MqttError):
    """A publish waited on was refused by the broker (PUBACK >= 0x80) or dropped as poison;
    the connection itself may well be fine."""

    def __init__(self, topic: str, failure: object) -> None:
        reason = getattr(failure, "reason", 0)
        kind = getattr(getattr(failure, "failure", None), "value", "refused")
        super().__init__(f"publish on {topic} {kind} by the broker (reason code {reason})")
        self.topic = topic
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientOptions:
    client_id: str
    keepalive_s: int = 60
    username: str | None = None
    password: str | None = None
    will: codec.Will | None = None
    version: int = codec.V5
    receive_maximum: int | None = None
    # MQTT 5: > 0 resumes the broker's session for this client id (Clean Start 0) and asks it
    # to keep the session that long after a connection ends; 0 starts clean every time.
    session_expiry_s: int = 0
    maximum_packet_size: int = MAX_INBOUND_PACKET
