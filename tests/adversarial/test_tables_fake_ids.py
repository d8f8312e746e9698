"""10,000 fake device ids against the gateway's per-device tables, on the real broker.

Every table keyed by a device id is bounded: the board channel's devices, the task runtime's
actors and its presence memory. Before the fix the actor table refused every device past
10,000 and never forgot one, so fake ids locked real boards out of lessons for good.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.adversarial.peers import Peer
from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import lesson_rig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

FAKES = 10_000
CHUNK = 2_000  # the broker queues at most 5000 QoS 1 messages per client: stay well under
POLL_S = 0.25


async def wait_until(check: Callable[[], bool], what: str, wait_s: float = 60.0) -> None:
    """Re-check a cheap in-process condition every POLL_S until it holds (bounded)."""
    try:
        async with asyncio.timeout(wait_s):
            while not check():  # noqa: ASYNC110 - the gateway's counters have no event to await
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"not within {wait_s}s: {what}") from None


async def test_ten_thousand_fake_ids_do_not_lock_out_a_real_board(
    fresh_broker: Broker, tmp_path: Path
) -> None:
    """Attack: 10,000 fake device ids each send a button event (published with broad credentials, as if 10,000 boards had been provisioned), filling every per-device table.
    Defence: each table stays at its bound by forgetting the least recently used idle or quiet entry (counted), so a real board still gets an actor, its commands and a complete lesson."""
    broker = fresh_broker
    async with lesson_rig(broker, tmp_path) as rig:
        gw = rig.gw
        creds = broker.gateway_credentials()
        flooder = Peer(
            broker.host,
            broker.port,
            creds.username,
            creds.password,
            f"t-{uuid.uuid4().hex}",
            max_inflight=1000,
        )
        flooder.start()
        try:
            assert await flooder.wait_connected() == 0
            fakes = [new_device_id() for _ in range(FAKES)]
            button = json.dumps({"v": 1, "evt": "button", "data": {"press": "short"}}).encode()
            actors = gw.tasks._actors  # each fake's button event spawns one (cheap to watch)
            for start in range(0, FAKES, CHUNK):
                for dev in fakes[start : start + CHUNK]:
                    flooder.publish(f"snlp/v1/{dev}/evt", button, qos=1)
                await wait_until(
                    lambda last=fakes[start + CHUNK - 1]: last in actors,
                    "the gateway handled the chunk",
                    wait_s=300,
                )
        finally:
            flooder.stop()
        # What the flood made the gateway publish (a retained status and a task event per new
        # device: 20,000 publishes through a window of 20) drains first; the real board's start
        # reply would queue behind it, and how long that takes is the machine's speed (minutes
        # under coverage on a busy CI host), not whether the board is locked out.
        outbox = gw.service.mqtt._outbox
        await wait_until(lambda: len(outbox) == 0, "the flood's publishes drained", wait_s=300)
        assert rig.metric("board_devices_tracked") == 10_000  # full, and no more
        assert rig.metric("runtime_devices") == 10_000
        assert len(gw.tasks._table.online) <= 10_000
        reply = await rig.start()
        assert reply["status"] == "accepted"
        await rig.wait_event("instance.completed", instance_id=reply["instance_id"], wait_s=60)
        assert len(rig.commands("PLAY_MEDIA")) == 4
        assert rig.metric("runtime_devices_evicted_total") >= 1  # the real board needed room
        assert rig.metric("board_devices_evicted_total") >= 1
        assert rig.metric("runtime_devices_refused_total") == 0
        assert gw.service.mqtt.connection_count == 1
