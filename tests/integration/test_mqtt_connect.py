"""A broker connect cancelled at any point (a failed start-up, a shutdown) leaves nothing behind:
no socket left open after the loop is gone, nothing logged by asyncio (with paho and aiomqtt
both printed tracebacks when a port was taken)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from devstack.gateway import gateway_settings
from gateway.mqtt.client import Client
from gateway.mqtt.connection import MqttConnection
from gateway.service import Context
from tests.support.broker import Broker

pytestmark = pytest.mark.integration


def recording(mqtt: MqttConnection, clients: list[Client]) -> None:
    make = mqtt._make_client

    def make_and_record() -> Client:
        clients.append(make())
        return clients[-1]

    mqtt._make_client = make_and_record  # type: ignore[method-assign]


async def test_a_connect_cancelled_at_any_point_leaves_nothing_open(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    clients: list[Client] = []
    for turns in [*range(1, 40), None]:  # after 1..39 loop turns (mid-connect), once connected
        mqtt = Context.create(gateway_settings(broker, tmp_path / str(turns))).mqtt
        recording(mqtt, clients)
        task = asyncio.create_task(mqtt.run(), name="test.mqtt")
        if turns is None:
            async with asyncio.timeout(10):
                await mqtt.wait_connected()
        for _ in range(turns or 0):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for _ in range(3):  # transports closed on cancel finish closing on the next turns
        await asyncio.sleep(0)
    assert len(clients) == 40
    assert [c for c in clients if c.is_connected] == []
    transports = [c._transport for c in clients if c._transport is not None]
    assert transports  # the later attempts got as far as a socket
    assert [t for t in transports if not t.is_closing()] == []
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_the_publish_window_follows_the_brokers_receive_maximum(
    broker: Broker, tmp_path: Path
) -> None:
    """Mosquitto tells MQTT 5 clients its max_inflight_messages (20) as Receive Maximum; a
    gateway configured for more publishes never has more than that awaiting PUBACK."""
    settings = gateway_settings(broker, tmp_path, mqtt={"max_inflight": 500})
    mqtt = Context.create(settings).mqtt
    clients: list[Client] = []
    recording(mqtt, clients)
    task = asyncio.create_task(mqtt.run())
    try:
        async with asyncio.timeout(10):
            await mqtt.wait_connected()
        assert clients[-1].broker_receive_maximum == 20
        most = 0
        for i in range(200):
            mqtt.publish(f"snlpgw/v1/ops/{settings.gateway_id}/events", b"{}", qos=1)
            most = max(most, clients[-1].unacknowledged)
            if i % 50 == 49:
                await asyncio.sleep(0)
        async with asyncio.timeout(10):
            while clients[-1].unacknowledged or mqtt._outbox.queued():
                most = max(most, clients[-1].unacknowledged)
                await asyncio.sleep(0.001)
        assert most == 20  # the window filled, and never past the broker's maximum
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
