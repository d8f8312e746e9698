"""Retained messages on device topics: the broker replays them at every (re)subscribe.

A device (or backend user) that publishes with the retain flag would have its message handled
again each time a gateway connects: a retained ``audio.completed`` or ``ack`` replayed into a
later lesson, a retained ``start`` request starting a lesson at every gateway restart.
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

pytestmark = pytest.mark.integration
DROPPED = 'board_inbound_dropped_total{{kind="{}",reason="retained"}}'


async def _until(check: Callable[[], bool], what: str, wait_s: float = 30.0) -> None:
    try:
        async with asyncio.timeout(wait_s):
            while not check():  # noqa: ASYNC110 - the gateway's counters have no event to await
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {wait_s}s: {what}") from None


def _json(**fields: object) -> bytes:
    return json.dumps(fields).encode()


async def test_retained_device_messages_are_ignored_at_every_subscribe(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a device leaves retained ack, report, event, heartbeat and voice-hello messages on its topics and a backend user a retained lesson start, so every gateway (re)subscribe replays them.
    Defence: retained messages on those topics are dropped and counted at each subscribe (only a retained board status counts, as presence), so no lesson starts and nothing reaches the runtime."""
    attacker = new_device_id()
    dev_creds = broker.provision(attacker)
    be_creds = broker.provision(f"ret-be-{uuid.uuid4().hex[:8]}", role="backend")
    assert broker.device_port is not None
    device = Peer(broker.host, broker.device_port, dev_creds.username, dev_creds.password, "d")
    backend = Peer(broker.host, broker.port, be_creds.username, be_creds.password, "b", mqtt5=True)
    retained = {
        f"snlp/v1/{attacker}/ack": _json(v=1, ref="c1", cmd="PLAY_MEDIA", status="accepted"),
        f"snlp/v1/{attacker}/rpt": _json(v=1, ref="c2", cmd="DOWNLOAD", stage="done", ok=True),
        f"snlp/v1/{attacker}/evt": _json(
            v=1, evt="audio.completed", ref="c1", data={"name": "01.mp3", "duration_ms": 10}
        ),
        f"snlp/v1/{attacker}/hb": _json(v=1, up_ms=5),
        f"device-server/{attacker}": _json(
            type="hello", version=3, transport="udp", audio_params={"format": "opus"}
        ),
    }
    start = _json(
        v=1, id="ret-1", action="start", app_id="english_learning",
        task_id="shadowing", lesson_id="unit01",
    )  # fmt: skip
    try:
        for peer in (device, backend):
            peer.start()
            assert await peer.wait_connected() == 0
        for topic, payload in retained.items():
            device.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
        ctl = backend.publish(f"snlpgw/v1/ctl/{attacker}", start, qos=1, retain=True)
        ctl.wait_for_publish(10)
        async with lesson_rig(broker, tmp_path, start=False) as rig:
            for connection in (1, 2):  # the first subscribe, then a restart's resubscribe
                await rig.start_gateway()
                await _until(
                    lambda: (
                        all(
                            rig.metric(DROPPED.format(kind)) == 1
                            for kind in ("ack", "rpt", "evt", "hb")
                        )
                        and rig.metric('xiaozhi_control_dropped_total{reason="retained"}') == 1
                        and rig.metric('ctl_invalid_total{reason="retained"}') == 1
                    ),
                    f"retained messages dropped and counted (connection {connection})",
                )
                assert rig.gw.tasks.runtime_of(attacker) is None  # nothing reached the runtime
                assert rig.metric("xiaozhi_hellos_total") == 0
                await rig.stop_gateway()
    finally:
        for topic in [*retained, f"snlpgw/v1/ctl/{attacker}"]:  # clear them for other tests
            peer = backend if "ctl" in topic else device
            peer.publish(topic, b"", qos=1, retain=True).wait_for_publish(10)
        device.stop()
        backend.stop()
