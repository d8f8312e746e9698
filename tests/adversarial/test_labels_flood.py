"""Label flood on the real broker: device strings must not become metric series.

Before the fix, a report's ``cmd``, an event's name and an ack's command became label values,
so nine 7.8 KB reports pushed the retained ops snapshot past Mosquitto's ``max_packet_size``
(65536) and the broker disconnected the gateway at every snapshot.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.peers import Peer
from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import lesson_rig
from tests.support.mqtt_client import ClientSession, mqtt_client

pytestmark = pytest.mark.integration

FLOOD = 40  # of each kind; 9 reports of 7.8 KB were enough to break the old snapshot
BIG = 7_800


def _junk() -> str:
    return secrets.token_hex(BIG // 2)  # unique every time, 7.8 KB


def flood_payloads(dev: str) -> list[tuple[str, bytes]]:
    """Reports, events and acks whose label-feeding strings are unique and 7.8 KB long."""
    out: list[tuple[str, bytes]] = []
    for _ in range(FLOOD):
        out.append((f"snlp/v1/{dev}/rpt", _json(ref=_junk()[:64], cmd=_junk(), stage="progress")))
        out.append((f"snlp/v1/{dev}/evt", _json(evt=f"sd.{_junk()}", data={})))
        out.append(
            (f"snlp/v1/{dev}/evt", _json(evt=f"app_task.{_junk()}", data={"state": "running"}))
        )
        out.append(
            (f"snlp/v1/{dev}/ack", _json(ref=_junk()[:900], cmd=_junk()[:6000], status="busy"))
        )
    return out


def _json(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}).encode()


async def _attack(broker: Broker, payloads: list[tuple[str, bytes]], dev: str) -> Peer:
    creds = broker.provision(dev)
    assert broker.device_port is not None
    peer = Peer(broker.host, broker.device_port, creds.username, creds.password, f"GID_x@@@{dev}")
    peer.start()
    assert await peer.wait_connected() == 0
    for topic, payload in payloads:
        peer.publish(topic, payload, qos=1)
    return peer


async def _snapshot_showing(ops: ClientSession, gw: str, key: str, expected: float) -> bytes:
    """The first retained snapshot (as the broker delivers it) in which ``key`` ≥ ``expected``."""
    topic = f"snlpgw/v1/ops/{gw}/metrics"
    async with asyncio.timeout(30):
        while True:
            message = await ops.expect(topic, wait_s=15)
            if json.loads(message.payload)["metrics"].get(f"snlpgw_{key}", 0) >= expected:
                return message.payload


async def test_label_flood_leaves_snapshot_bounded_and_gateway_connected(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a device floods reports, events and acks whose command names, event names and command ids are unique 7.8 KB strings, while a lesson runs on another board.
    Defence: every such label maps to a fixed set plus `other`, so the retained snapshot stays small, the gateway keeps its one broker connection and the lesson completes."""
    async with lesson_rig(broker, tmp_path) as rig:
        ops_creds = broker.provision(f"ops-{uuid.uuid4().hex[:8]}", role="ops")
        async with mqtt_client(broker, ops_creds) as ops:
            await ops.subscribe(f"snlpgw/v1/ops/{rig.settings.gateway_id}/metrics")
            reply = await rig.start()
            attacker = new_device_id()
            peer = await _attack(broker, flood_payloads(attacker), attacker)
            try:
                await rig.wait_event("instance.completed", instance_id=reply["instance_id"])
                done = 'board_reports_total{cmd="other",stage="progress"}'
                raw = await _snapshot_showing(ops, rig.settings.gateway_id, done, FLOOD)
            finally:
                peer.stop()
        snapshot: dict[str, float] = json.loads(raw)["metrics"]
        assert len(raw) < 16_384, "the flood grew the snapshot"
        assert snapshot[f"snlpgw_{done}"] == FLOOD
        assert snapshot['snlpgw_board_inbound_unmatched_total{kind="ack"}'] == FLOOD
        assert snapshot['snlpgw_board_events_total{evt="app_task",form="structured"}'] == FLOOD
        dropped = 'snlpgw_board_inbound_dropped_total{kind="evt",reason="unknown_type"}'
        assert snapshot[dropped] == FLOOD
        assert max(len(key) for key in snapshot) < 200  # no device string became a label
        mqtt = rig.gw.service.mqtt
        assert mqtt.connected
        assert mqtt.connection_count == 1
        assert rig.metric("metrics_snapshot_series_dropped_total") == 0


async def test_snapshot_over_its_cap_drops_detail_not_the_connection(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a device floods its topics so that the gateway's metrics outgrow the snapshot budget (forced here with a 4 KB cap).
    Defence: the retained snapshot leaves out the most detailed series, counts them, stays under the cap and the gateway stays connected."""
    cap = 4096
    async with lesson_rig(broker, tmp_path, ops={"snapshot_max_bytes": cap}) as rig:
        ops_creds = broker.provision(f"ops-{uuid.uuid4().hex[:8]}", role="ops")
        async with mqtt_client(broker, ops_creds) as ops:
            await ops.subscribe(f"snlpgw/v1/ops/{rig.settings.gateway_id}/metrics")
            reply = await rig.start()
            attacker = new_device_id()
            peer = await _attack(broker, flood_payloads(attacker)[:40], attacker)
            try:
                await rig.wait_event("instance.completed", instance_id=reply["instance_id"])
                done = 'board_reports_total{cmd="other",stage="progress"}'
                raw = await _snapshot_showing(ops, rig.settings.gateway_id, done, 10)
            finally:
                peer.stop()
        snapshot: dict[str, float] = json.loads(raw)["metrics"]
        assert len(raw) <= cap
        assert snapshot["snlpgw_ops_snapshot_series_dropped"] > 0
        assert "snlpgw_mqtt_connects_total" in snapshot  # totals stay
        assert rig.metric("metrics_snapshot_series_dropped_total") > 0
        assert rig.gw.service.mqtt.connection_count == 1
