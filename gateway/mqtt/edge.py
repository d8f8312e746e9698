"""The broker connection as the rest of the gateway sees it (:mod:`gateway.mqtt` is the
connection itself): the received message, the handler and publisher ports components are built
with, and the gateway's identity on the broker (client id, presence body).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from topics import GatewayStatus, encode


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
        on_sent: Callable[[], None] | None = None,
    ) -> bool | None: ...


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
