"""Publish links on the real Mosquitto, with the project's broker config (ACL, per-listener
passwords, max_inflight_messages 20): the gateway's extra publish-only connections log in with
its own credentials, and 2,400 QoS 1 publishes over 40 device topics all arrive, each topic's in
the order published, while more than one connection's Receive Maximum is in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from devstack.gateway import gateway_settings
from gateway.service import Context
from tests.support.broker import Broker
from tests.support.mqtt_client import mqtt_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEVICES = [f"aa_bb_cc_dd_{i // 256:02x}_{i % 256:02x}" for i in range(40)]
ROUNDS = 60


async def test_publish_links_deliver_every_topic_in_order_on_the_real_broker(
    broker: Broker, tmp_path: Path
) -> None:
    mqtt = Context.create(gateway_settings(broker, tmp_path, mqtt={"publish_links": 3})).mqtt
    user = broker.provision("be-links", role="backend")
    got: dict[str, list[int]] = {d: [] for d in DEVICES}
    async with mqtt_client(broker, user) as backend, asyncio.TaskGroup() as tg:
        for dev in DEVICES:
            await backend.subscribe(f"snlpgw/v1/task/{dev}")
        run = tg.create_task(mqtt.run(), name="test.mqtt")
        async with asyncio.timeout(20):
            await mqtt.wait_connected()
            # Ready, and every connection's publish loop running (no event for either).
            while mqtt.health()["ok"] is not True or not all(  # noqa: ASYNC110 - bounded
                o._client is not None for o in mqtt._outboxes
            ):
                await asyncio.sleep(0.02)
        assert mqtt.health()["publish_links"] == "3/3 connected"
        for n in range(ROUNDS):
            for dev in DEVICES:
                body = json.dumps({"n": n, "device": dev}).encode()
                assert mqtt.publish(f"snlpgw/v1/task/{dev}", body, qos=1)
        # Written at once up to each connection's window (task events: 15 of its 20, a quarter
        # is kept for board commands): four windows in flight where one allowed 15.
        assert sum(len(o._in_flight) for o in mqtt._outboxes) == 4 * 15
        async with asyncio.timeout(60):
            for _ in range(ROUNDS * len(DEVICES)):
                message = await backend.queue.get()
                body = json.loads(message.payload)
                got[body["device"]].append(body["n"])
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert all(seq == list(range(ROUNDS)) for seq in got.values())  # all, each in order
