"""The broker connection's component-facing behaviour that needs no broker."""

from __future__ import annotations

import json
import logging

import pytest

from gateway.metrics import Metrics
from gateway.mqtt.codec import PublishPacket
from gateway.mqtt.connection import MqttConnection
from gateway.mqtt.edge import Inbound, gateway_client_id, presence_payload
from gateway.mqtt.outbound import Lane, lane_for
from gateway.settings import MqttSettings


def _conn(queue: int = 100, control: int = 100) -> tuple[MqttConnection, Metrics]:
    metrics = Metrics()
    conn = MqttConnection(
        settings=MqttSettings(outbound_queue=queue, control_queue=control),
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


def test_events_lane_drops_oldest_when_full_and_counts() -> None:
    conn, metrics = _conn(queue=100)
    for i in range(105):
        assert conn.publish("snlpgw/v1/task/aa_bb_cc_dd_ee_ff", f"{i}")
    assert len(conn._outbox) == 100
    assert conn._outbox.queued(Lane.EVENTS)[0].payload == b"5"  # the five oldest went
    assert metrics.snapshot()["snlpgw_mqtt_messages_out_dropped_total"] == 5.0


def test_control_lane_never_drops_it_refuses_the_newest_and_counts() -> None:
    conn, metrics = _conn(queue=100, control=100)
    results = [conn.publish("snlp/v1/aa_bb_cc_dd_ee_ff/cmd", f"{i}", qos=1) for i in range(103)]
    assert results == [True] * 100 + [False] * 3
    queued = conn._outbox.queued(Lane.CONTROL)
    assert [m.payload for m in queued] == [str(i).encode() for i in range(100)]  # none lost
    snap = metrics.snapshot()
    assert snap["snlpgw_mqtt_messages_out_refused_total"] == 3.0
    assert snap["snlpgw_mqtt_messages_out_dropped_total"] == 0.0
    # A full events lane does not touch the control lane, and the reverse.
    for i in range(150):
        conn.publish("snlpgw/v1/ops/gw/events", f"e{i}", qos=1)
    assert len(conn._outbox.queued(Lane.CONTROL)) == 100
    assert len(conn._outbox.queued(Lane.EVENTS)) == 100


def test_a_flood_on_full_lanes_logs_the_first_loss_and_every_hundredth(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn, metrics = _conn(queue=100, control=100)
    caplog.set_level(logging.WARNING, logger="gateway.mqtt.connection")
    for i in range(350):
        conn.publish("snlpgw/v1/task/aa_bb_cc_dd_ee_ff", f"e{i}")
        conn.publish("snlp/v1/aa_bb_cc_dd_ee_ff/cmd", f"c{i}", qos=1)
    snap = metrics.snapshot()  # every loss is counted ...
    assert snap["snlpgw_mqtt_messages_out_dropped_total"] == 250.0
    assert snap["snlpgw_mqtt_messages_out_refused_total"] == 250.0
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]  # ... three lines per lane
    prefix = "outbound events lane full: dropped oldest publish on snlpgw/v1/task/aa_bb_cc_dd_ee_ff"
    assert [m for level, m in lines if level == logging.WARNING] == [
        f"{prefix} ({n} so far)" for n in (1, 101, 201)
    ]
    prefix = "outbound control lane full: refused publish on snlp/v1/aa_bb_cc_dd_ee_ff/cmd"
    assert [m for level, m in lines if level == logging.ERROR] == [
        f"{prefix} ({n} so far)" for n in (1, 101, 201)
    ]


def test_lanes_by_topic() -> None:
    for topic in (
        "snlp/v1/aa_bb_cc_dd_ee_ff/cmd",
        "snlp/v1/aa_bb_cc_dd_ee_ff/status",
        "snlpgw/v1/reply/aa_bb_cc_dd_ee_ff",
        "backend/replies/42",  # an MQTT 5 response topic
        "devices/p2p/aa_bb_cc_dd_ee_ff",
        "snlpgw/v1/gw/gw1/status",
    ):
        assert lane_for(topic) is Lane.CONTROL, topic
    for topic in (
        "snlpgw/v1/task/aa_bb_cc_dd_ee_ff",
        "snlpgw/v1/assessment/aa_bb_cc_dd_ee_ff",
        "snlpgw/v1/ops/gw1/metrics",
        "snlpgw/v1/ops/gw1/events",
    ):
        assert lane_for(topic) is Lane.EVENTS, topic


def test_oversized_publish_is_refused_and_counted() -> None:
    conn, metrics = _conn()
    assert not conn.publish("snlp/v1/aa_bb_cc_dd_ee_ff/cmd", b"x" * 70_000, qos=1)
    assert len(conn._outbox) == 0
    assert metrics.snapshot()["snlpgw_mqtt_messages_out_oversize_total"] == 1.0


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


def test_received_messages_are_dispatched_with_their_mqtt5_properties() -> None:
    conn, metrics = _conn()
    seen: list[Inbound] = []
    conn.route("snlpgw/v1/ctl/+", seen.append)
    conn._on_message(
        PublishPacket("snlpgw/v1/ctl/aa_bb_cc_dd_ee_ff", b"{}", 1, False, 7, "r/1", b"cid")
    )
    conn._on_message(PublishPacket("snlpgw/v1/ctl/x", b"y" * 9000, 1, False, 8))  # over 8192
    (msg,) = seen
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (
        "snlpgw/v1/ctl/aa_bb_cc_dd_ee_ff",
        b"{}",
        1,
        False,
    )
    assert (msg.response_topic, msg.correlation_data) == ("r/1", b"cid")
    assert conn.received == 2
    snap = metrics.snapshot()
    assert snap['snlpgw_mqtt_messages_in_dropped_total{reason="oversize"}'] == 1.0
