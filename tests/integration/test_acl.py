"""The generated ACL on a real Mosquitto: who may publish and read what.

Refusals are shown two ways: the MQTT 5 PUBACK reason code (135 = not authorized), and a
privileged subscriber that receives a later sentinel message but not the refused one (one
publisher's messages reach a subscriber in order, so once the sentinel is in, the refused
message would have been too).
"""

from __future__ import annotations

import secrets

import aiomqtt
import pytest

from gateway.broker.credentials import Credentials
from gateway.mqtt.probe import connack
from tests.support.broker import Broker, new_device_id
from tests.support.mqtt_client import mqtt_client, publish_reason_code

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 135
ALLOWED = (0, 16)  # success / success with no matching subscribers


def _role_user(broker: Broker, role: str) -> Credentials:
    return broker.provision(f"{role}-{secrets.token_hex(4)}", role=role)  # type: ignore[arg-type]


def test_anonymous_and_wrong_password_are_refused(broker: Broker, device_id: str) -> None:
    assert connack(broker.host, broker.port, None, None) == NOT_AUTHORIZED
    creds = broker.provision(device_id)
    assert connack(broker.host, broker.port, device_id, "wrong") == NOT_AUTHORIZED
    assert connack(broker.host, broker.port, device_id, creds.password) == 0


async def test_anonymous_mqtt_client_gets_an_error(broker: Broker) -> None:
    anonymous = Credentials("", None, broker.gateway_credentials().role, None, (), ())
    with pytest.raises(aiomqtt.MqttError):
        async with mqtt_client(broker, anonymous):
            pass


def test_device_publishes_only_its_own_topics(broker: Broker, device_id: str) -> None:
    creds = broker.provision(device_id)
    for topic in creds.publish:
        assert publish_reason_code(broker, creds, topic) in ALLOWED, topic
    other = new_device_id()
    for topic in (f"snlp/v1/{other}/evt", f"snlp/v1/{device_id}/cmd", f"devices/p2p/{device_id}"):
        assert publish_reason_code(broker, creds, topic) == NOT_AUTHORIZED, topic
    assert publish_reason_code(broker, creds, "snlpgw/v1/ctl/x") == NOT_AUTHORIZED


@pytest.mark.parametrize(
    ("subscription", "uplink", "qos"),  # the QoS each firmware publishes with
    [("snlp/v1/+/evt", "snlp/v1/{}/evt", 1), ("device-server/#", "device-server/{}", 0)],
    ids=["board-evt", "xiaozhi-control"],
)
async def test_gateway_never_sees_a_forged_uplink(
    broker: Broker, device_id: str, subscription: str, uplink: str, qos: int
) -> None:
    """A device publishing on another device's uplink topic is dropped by the broker; its own
    (published after it) arrives."""
    victim = new_device_id()
    device = broker.provision(device_id)
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, device) as board,
    ):
        await gateway.subscribe(subscription)
        await board.publish(uplink.format(victim), b'{"forged": true}', qos=qos)
        await board.publish(uplink.format(device_id), b'{"own": true}', qos=qos)
        own = await gateway.expect(uplink.format(device_id))
        assert own.payload == b'{"own": true}'
        assert uplink.format(victim) not in gateway.topics_seen()


async def test_device_cannot_read_other_cmd_or_assessments(broker: Broker, device_id: str) -> None:
    other = new_device_id()
    device = broker.provision(device_id)
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, device) as board,
    ):
        for topic_filter in (f"snlp/v1/{other}/cmd", "snlpgw/v1/assessment/#", "snlp/v1/#"):
            await board.subscribe(topic_filter)  # 2.0 grants the SUBACK; delivery is checked
        await board.subscribe(f"snlp/v1/{device_id}/cmd")
        await gateway.publish(f"snlp/v1/{other}/cmd", b"other")
        await gateway.publish(f"snlpgw/v1/assessment/{device_id}", b"metrics")
        await gateway.publish(f"snlp/v1/{device_id}/cmd", b"own")
        own = await board.expect(f"snlp/v1/{device_id}/cmd")
        assert own.payload == b"own"
        assert board.topics_seen() == [f"snlp/v1/{device_id}/cmd"]


def test_ops_user_cannot_publish_anything(broker: Broker, device_id: str) -> None:
    ops = _role_user(broker, "ops")
    name = ops.username
    topics = [
        f"snlp/v1/{name}/evt",  # the device patterns' own-name grants
        f"snlp/v1/{name}/status",
        f"device-server/{name}",
        f"snlp/v1/{device_id}/cmd",
        "snlpgw/v1/ops/gw1/metrics",
        f"snlpgw/v1/ctl/{device_id}",
        f"snlpgw/v1/assessment/{device_id}",
        "snlpgw/v1/gw/gw1/status",
        "anything/else",
    ]
    for topic in topics:
        assert publish_reason_code(broker, ops, topic) == NOT_AUTHORIZED, topic


async def test_ops_reads_metrics_and_gateway_status_only(broker: Broker, device_id: str) -> None:
    ops = _role_user(broker, "ops")
    gw_id = f"gw-{secrets.token_hex(3)}"
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, ops) as dashboard,
    ):
        for topic_filter in (f"snlp/v1/{ops.username}/cmd", f"devices/p2p/{ops.username}", "#"):
            await dashboard.subscribe(topic_filter)
        await gateway.publish(f"snlp/v1/{ops.username}/cmd", b"pattern-leak")
        await gateway.publish(f"devices/p2p/{ops.username}", b"pattern-leak")
        await gateway.publish(f"snlpgw/v1/assessment/{device_id}", b"not for ops")
        await gateway.publish(f"snlpgw/v1/gw/{gw_id}/status", b'{"online": true}')
        await gateway.publish(f"snlpgw/v1/ops/{gw_id}/metrics", b'{"devices_online": 1}')
        metrics = await dashboard.expect(f"snlpgw/v1/ops/{gw_id}/metrics")
        assert metrics.payload == b'{"devices_online": 1}'
        seen = dashboard.topics_seen()
        assert f"snlpgw/v1/gw/{gw_id}/status" in seen
        # Retained messages of other tests may show up under "#"; none may be outside ops' tree.
        readable = ("snlpgw/v1/ops/", "snlpgw/v1/gw/")
        assert [t for t in seen if not t.startswith(readable)] == []


async def test_backend_sends_ctl_and_reads_assessment(broker: Broker, device_id: str) -> None:
    backend = _role_user(broker, "backend")
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, backend) as app,
    ):
        await gateway.subscribe(f"snlpgw/v1/ctl/{device_id}")
        await gateway.subscribe(f"snlp/v1/{device_id}/#")
        await app.subscribe(f"snlpgw/v1/assessment/{device_id}")
        await app.subscribe(f"snlp/v1/{device_id}/#")
        await app.publish(f"snlp/v1/{device_id}/cmd", b"bypass the gateway")
        await app.publish(f"snlpgw/v1/ctl/{device_id}", b'{"op": "start"}')
        ctl = await gateway.expect(f"snlpgw/v1/ctl/{device_id}")
        assert ctl.payload == b'{"op": "start"}'
        assert gateway.topics_seen() == [f"snlpgw/v1/ctl/{device_id}"]

        await gateway.publish(f"snlp/v1/{device_id}/evt", b"device traffic")
        await gateway.publish(f"snlpgw/v1/assessment/{device_id}", b'{"metrics": []}')
        result = await app.expect(f"snlpgw/v1/assessment/{device_id}")
        assert result.payload == b'{"metrics": []}'
        assert app.topics_seen() == [f"snlpgw/v1/assessment/{device_id}"]
    for topic in (f"snlp/v1/{backend.username}/evt", f"snlpgw/v1/reply/{device_id}"):
        assert publish_reason_code(broker, backend, topic) == NOT_AUTHORIZED, topic


async def test_xiaozhi_downlink_is_per_device(broker: Broker, device_id: str) -> None:
    other = new_device_id()
    device = broker.provision(device_id)
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, device) as board,
    ):
        await board.subscribe("devices/p2p/#")
        await gateway.publish(f"devices/p2p/{other}", b'{"type": "hello"}')
        await gateway.publish(f"devices/p2p/{device_id}", b'{"type": "hello"}')
        await board.expect(f"devices/p2p/{device_id}")
        assert board.topics_seen() == [f"devices/p2p/{device_id}"]
