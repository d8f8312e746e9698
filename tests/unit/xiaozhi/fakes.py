"""Hand-written fakes at the transport edges (MQTT publisher, datagram transport) and helpers."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from gateway.metrics import Metrics
from gateway.mqtt.edge import Inbound
from gateway.settings import Settings
from gateway.xiaozhi.channel import XiaozhiChannel
from tests.support import fake_mqtt

DEV = "24_0a_c4_00_00_01"
OTHER = "24_0a_c4_00_00_02"

HELLO = {
    "type": "hello",
    "version": 3,
    "transport": "udp",
    "features": {"mcp": True},
    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
}


class XiaozhiPublisher(fake_mqtt.FakePublisher):
    """The MQTT edge (tests/support/fake_mqtt.py), read per device."""

    def to(self, dev: str) -> list[dict[str, Any]]:
        return [p.json() for p in self.sent if p.topic == f"devices/p2p/{dev}"]

    def last(self, dev: str) -> dict[str, Any]:
        return self.to(dev)[-1]


class FakeDatagramTransport(asyncio.DatagramTransport):
    """Records what the endpoint sends; no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[bytes, Any]] = []
        self.closed = False

    def sendto(self, data: Any, addr: Any = None) -> None:
        self.sent.append((bytes(data), addr))

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 48884) if name == "sockname" else default


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def inbound(dev: str, body: dict[str, Any] | bytes, topic: str | None = None) -> Inbound:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Inbound(
        topic=topic or f"device-server/{dev}",
        payload=payload,
        qos=0,
        retain=False,
        received_mono=time.monotonic(),
        received_ms=0,
    )


def make_channel(
    clock: FakeClock | None = None,
    *,
    ready: bool = True,
    xiaozhi: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[XiaozhiChannel, XiaozhiPublisher, Metrics]:
    metrics = Metrics()
    pub = XiaozhiPublisher()
    channel = XiaozhiChannel(
        settings=Settings(
            udp={"port": 0, "public_host": "gw.example", "public_port": 8884},
            xiaozhi=xiaozhi or {},
        ),
        mqtt=pub,
        metrics=metrics,
        http=None,
        admin=None,
        clock=clock or FakeClock(),
        **kwargs,
    )
    if ready:
        channel.udp_endpoint.connection_made(FakeDatagramTransport())
        channel.bound()
    return channel, pub, metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(f"snlpgw_{name}", labels)
    return 0.0 if value is None else value
