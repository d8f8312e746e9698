"""The broker connection's component-facing behaviour that needs no broker."""

from __future__ import annotations

import json

import aiomqtt

from gateway.metrics import Metrics
from gateway.mqtt import Inbound, MqttConnection, gateway_client_id, presence_payload
from gateway.settings import MqttSettings


def _conn(queue: int = 100) -> tuple[MqttConnection, Metrics]:
    metrics = Metrics()
    conn = MqttConnection(
        settings=MqttSettings(outbound_queue=queue),
        password=None,
        client_id="t",
        presence_topic="snlpgw/v1/gw/t/status",
        presence_payload=presence_payload("t"),
        metrics=metrics,
    )
    return conn, metrics


def _inbound(topic: str) -> Inbound:
    return Inbound(
        topic=topic, payload=b"{}", qos=1, retain=False, received_mono=0.0, received_ms=0
    )


def test_outbound_queue_drops_oldest_when_full_and_counts() -> None:
    conn, metrics = _conn(queue=100)
    for i in range(105):
        conn.publish("t/x", f"{i}")
    assert len(conn._outbox) == 100
    assert conn._outbox.queued()[0].payload == b"5"  # the five oldest went
    assert metrics.snapshot()["snlpgw_mqtt_messages_out_dropped_total"] == 5.0


def test_dispatch_routes_by_filter_and_contains_handler_errors() -> None:
    conn, metrics = _conn()
    seen: list[str] = []

    def boom(_: Inbound) -> None:
        raise ValueError("handler bug")

    conn.route("snlp/v1/+/evt", lambda m: seen.append(m.topic))
    conn.route("snlp/v1/+/hb", boom)
    conn._dispatch(_inbound("snlp/v1/aa_bb_cc_dd_ee_ff/evt"))
    conn._dispatch(_inbound("snlp/v1/aa_bb_cc_dd_ee_ff/hb"))
    conn._dispatch(_inbound("other/topic"))
    assert seen == ["snlp/v1/aa_bb_cc_dd_ee_ff/evt"]
    snap = metrics.snapshot()
    assert snap['snlpgw_mqtt_messages_in_dropped_total{reason="handler_error"}'] == 1.0
    assert snap['snlpgw_mqtt_messages_in_dropped_total{reason="no_route"}'] == 1.0


def test_presence_payload_shape() -> None:
    body = json.loads(presence_payload("gw1")(True))
    assert body["v"] == 1
    assert body["online"] is True
    assert body["gateway_id"] == "gw1"
    assert isinstance(body["ts"], int)


def test_gateway_client_id_is_secret_derived_and_stable() -> None:
    one = gateway_client_id("gw1", "pw-a")
    assert one == gateway_client_id("gw1", "pw-a")  # stable across restarts
    assert one.startswith("gw1".join(("snlpgw-", "-")))
    assert len(one) == len("snlpgw-gw1-") + 20
    assert gateway_client_id("gw1", "pw-b") != one  # unguessable without the password
    assert gateway_client_id("gw2", "pw-a") != one
    assert gateway_client_id("gw1", None) != gateway_client_id("gw1", None)  # random


async def test_inbound_queue_drops_newest_when_full_and_counts() -> None:
    conn, metrics = _conn()
    client = conn._make_client()
    queue = client._queue  # aiomqtt's inbound queue, built from our class and bound
    assert queue.maxsize == MqttSettings().inbound_queue
    messages = [
        aiomqtt.Message(f"snlp/v1/x/{i}", b"{}", qos=0, retain=False, mid=i, properties=None)
        for i in range(queue.maxsize + 3)
    ]
    for message in messages:
        queue.put_nowait(message)  # never raises: overflow is dropped here, not in aiomqtt
    assert queue.qsize() == queue.maxsize
    assert queue.get_nowait() is messages[0]  # the oldest stay; the newest were dropped
    key = 'snlpgw_mqtt_messages_in_dropped_total{reason="queue_full"}'
    assert metrics.snapshot()[key] == 3.0
