"""The gateway's MQTT 5 connection against a real Mosquitto 2.0.11 configured the ways MQTT lets a
broker limit its clients (issue #26): each test starts a broker of its own with the project's
generated config (auth and ACLs on) plus a variant (:func:`tests.support.broker.start_variant`)
and runs the gateway's :class:`~gateway.mqtt.connection.MqttConnection` against it. The rules
are :mod:`gateway.mqtt.session`'s; each test's docstring names the one it checks.

What Mosquitto 2.0.11 does, as these tests found it: it announces ``max_packet_size`` as
Maximum Packet Size and ``max_keepalive`` as Server Keep Alive in CONNACK; it refuses a CONNECT
whose will is retained under ``retain_available false`` (0x9A) and one whose will has QoS 1
under ``max_qos 0`` (0x9B); it ends a connection for a PUBLISH whose topic holds a control
character (DISCONNECT 0x81, Malformed Packet, then closes); it never refuses a SUBSCRIBE by its
``acl_file`` (hence the dynamic-security plugin in the refused-subscription test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devstack.gateway import gateway_settings
from gateway.mqtt.connection import MqttConnection
from gateway.mqtt.edge import Inbound
from gateway.service import Context
from tests.support.broker import Broker, start_variant
from tests.support.cut_proxy import cut_proxy
from tests.support.lesson_rig import clip_path, lesson_rig
from tests.support.mqtt_client import ClientSession, mqtt_client

pytestmark = pytest.mark.integration

WAIT_S = 15.0


@pytest.fixture
def variant(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker of its own, from ``@pytest.mark.parametrize("variant", [...], indirect=True)``:
    config lines (a string) or ``start_variant``'s keyword arguments (a dict)."""
    param = request.param
    kwargs = param if isinstance(param, dict) else {"config": param}
    running = start_variant(tmp_path / "broker", **kwargs)
    yield running
    running.stop()


def metric(ctx: Context, key: str) -> float:
    return ctx.metrics.snapshot().get(f"snlpgw_{key}", 0.0)


@contextlib.asynccontextmanager
async def connected(ctx: Context) -> AsyncIterator[MqttConnection]:
    """The context's MQTT connection alone (no service: no periodic metrics publishes to
    count), running until the block exits, once connected."""
    mqtt = ctx.mqtt
    task = asyncio.create_task(mqtt.run(), name="test.mqtt")
    try:
        async with asyncio.timeout(WAIT_S):
            await mqtt.wait_connected()
        yield mqtt
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def stays_up(mqtt: MqttConnection, window_s: float) -> None:
    """Assert the connection is not lost within ``window_s`` (an absence: a fixed window)."""
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(window_s):
            await mqtt.wait_disconnected()
    assert mqtt.connected


async def next_payload(session: ClientSession, topic: str) -> bytes:
    return (await session.expect(topic, wait_s=WAIT_S)).payload


async def first_payload(session: ClientSession, topic: str) -> bytes:
    """The first message on ``topic`` this client received, waiting for it if none yet
    (``expect`` passes over messages on other topics; they stay in ``received``)."""
    for message in session.received:
        if message.topic == topic:
            return message.payload
    return await next_payload(session, topic)


@pytest.mark.parametrize("variant", ["max_keepalive 10"], indirect=True)
async def test_the_brokers_server_keep_alive_replaces_the_asked_one(
    variant: Broker, tmp_path: Path
) -> None:
    """MQTT 5 §3.2.2.3.14: a Server Keep Alive in CONNACK is the keep-alive the client must use.
    The gateway asks for 60 s; Mosquitto (``max_keepalive 10``) answers 10 and ends a connection
    silent for 1.5 x 10 s: the gateway pings on the broker's terms and stays connected."""
    ctx = Context.create(gateway_settings(variant, tmp_path, mqtt={"keepalive_s": 60}))
    async with connected(ctx) as mqtt:
        assert mqtt._session.limits.keepalive_s == 10
        await stays_up(mqtt, 25.0)  # a gateway on 60 s was dropped at ~15-17 s
        assert mqtt.connection_count == 1
        assert metric(ctx, 'mqtt_connection_losses_total{how="lost"}') == 0


@pytest.mark.parametrize("variant", ["max_packet_size 2048"], indirect=True)
async def test_a_publish_over_the_brokers_maximum_packet_size_is_refused_here(
    variant: Broker, tmp_path: Path, device_id: str
) -> None:
    """MQTT 5 §3.2.2.3.6: a client must not send a packet over the broker's Maximum Packet
    Size (the broker disconnects it). Mosquitto announces ``max_packet_size`` (2048, under the
    gateway's own 65536): a 4 KB publish is refused before it is sent and counted
    (``too_large``); the connection stays, and smaller publishes flow."""
    ctx = Context.create(gateway_settings(variant, tmp_path))
    topic = f"snlp/v1/{device_id}/cmd"
    async with (
        connected(ctx) as mqtt,
        mqtt_client(variant, variant.gateway_credentials()) as board,
    ):
        assert mqtt.max_packet_bytes == 2048
        await board.subscribe(topic)
        assert mqtt.publish(topic, b"x" * 4096, qos=1) is False
        assert metric(ctx, 'mqtt_publish_failed_total{reason="too_large"}') == 1
        assert mqtt.publish(topic, b"y" * 1000, qos=1)
        assert await next_payload(board, topic) == b"y" * 1000
        assert mqtt.connected
        assert mqtt.connection_count == 1
        assert metric(ctx, 'mqtt_connection_losses_total{how="lost"}') == 0


@pytest.mark.parametrize("variant", ["max_packet_size 4194304"], indirect=True)
async def test_a_large_inbound_message_does_not_cost_the_connection(
    variant: Broker, tmp_path: Path, device_id: str
) -> None:
    """MQTT 5 §3.1.2.11.4: a client's Maximum Packet Size in CONNECT binds the broker, which
    drops a bigger message for that client instead of sending it. Another client publishes a
    legal 1.5 MiB message (the broker takes up to 4 MiB) on a topic the gateway routes: the
    gateway (announcing 1 MiB) never sees it, stays connected and gets the next message."""
    ctx = Context.create(gateway_settings(variant, tmp_path))
    topic = f"snlp/v1/{device_id}/evt"
    seen: asyncio.Queue[Inbound] = asyncio.Queue(10)
    ctx.mqtt.route(topic, seen.put_nowait, qos=1)
    async with (
        connected(ctx) as mqtt,
        mqtt_client(variant, variant.gateway_credentials()) as sender,
    ):
        await sender.publish(topic, b"z" * (3 << 19), qos=1)  # 1.5 MiB, acknowledged
        await sender.publish(topic, b"after", qos=1)
        got = await asyncio.wait_for(seen.get(), WAIT_S)
        assert got.payload == b"after"
        assert seen.empty()
        assert mqtt.connected
        assert mqtt.connection_count == 1
        assert metric(ctx, 'mqtt_connection_losses_total{how="lost"}') == 0


@pytest.mark.parametrize("variant", ["max_qos 0"], indirect=True)
async def test_a_broker_offering_qos_0_only_gets_qos_0_publishes(
    variant: Broker, tmp_path: Path, device_id: str
) -> None:
    """MQTT 5 §3.2.2.3.4: a client must not send above the broker's Maximum QoS. Mosquitto
    (``max_qos 0``) refuses the gateway's CONNECT once for its QoS 1 will (0x9B); the next
    CONNECT carries the will at QoS 0 and is accepted. QoS 1 publishes go out at QoS 0
    (counted ``qos_downgraded``), reach a subscriber, and nothing reconnects."""
    ctx = Context.create(gateway_settings(variant, tmp_path))
    topic = f"snlp/v1/{device_id}/cmd"
    async with (
        connected(ctx) as mqtt,
        mqtt_client(variant, variant.gateway_credentials()) as board,
    ):
        assert mqtt._session.limits.maximum_qos == 0
        await board.subscribe(topic)
        for i in range(5):
            assert mqtt.publish(topic, f"m{i}", qos=1)
        assert [await next_payload(board, topic) for _ in range(5)] == [
            f"m{i}".encode() for i in range(5)
        ]
        assert metric(ctx, 'mqtt_fallbacks_total{kind="qos_downgraded"}') >= 5
        await stays_up(mqtt, 3.0)
        assert mqtt.connection_count == 1
        assert metric(ctx, 'mqtt_connection_losses_total{how="refused"}') == 1
        assert metric(ctx, 'mqtt_connection_losses_total{how="lost"}') == 0


@pytest.mark.parametrize("variant", ["retain_available false"], indirect=True)
async def test_a_broker_without_retained_messages_gets_unretained_presence(
    variant: Broker, tmp_path: Path
) -> None:
    """MQTT 5 §3.2.2.3.5: a client must not send a retained message (nor a retained will) to a
    broker without Retain Available. Mosquitto (``retain_available false``) refuses the
    gateway's CONNECT once for its retained will (0x9A); the next CONNECT carries the will
    unretained and is accepted, the presence goes out unretained (counted ``retain_dropped``),
    and the connection holds: no reconnect loop (before the fix: 25 reconnections in 5 s)."""
    settings = gateway_settings(variant, tmp_path)
    ctx = Context.create(settings)
    status = f"snlpgw/v1/gw/{settings.gateway_id}/status"
    async with mqtt_client(variant, variant.gateway_credentials()) as ops:
        await ops.subscribe(status)
        async with connected(ctx) as mqtt:
            presence = await ops.expect(status, wait_s=WAIT_S)
            assert json.loads(presence.payload)["online"] is True
            assert not presence.retain
            assert metric(ctx, 'mqtt_fallbacks_total{kind="retain_dropped"}') >= 1
            await stays_up(mqtt, 5.0)
            assert mqtt.connection_count == 1
            assert metric(ctx, 'mqtt_connection_losses_total{how="refused"}') == 1
            assert metric(ctx, 'mqtt_connection_losses_total{how="lost"}') == 0


@pytest.mark.parametrize("variant", [""], indirect=True)
async def test_a_publish_the_broker_disconnects_for_is_dropped_as_poison(
    variant: Broker, tmp_path: Path, device_id: str
) -> None:
    """The poison rule (gateway/mqtt/session.py): a publish the broker ends the connection for
    is dropped, counted and alarmed, never sent again, and what was queued after it is
    delivered. The poison is legal for the client (MQTT 5 §1.5.4 lets a receiver treat a
    control character in a UTF-8 string as malformed; the client does not forbid it):
    Mosquitto answers it with DISCONNECT 0x81 (Malformed Packet)."""
    settings = gateway_settings(variant, tmp_path)
    ctx = Context.create(settings)
    topic = f"snlp/v1/{device_id}/cmd"
    events = f"snlpgw/v1/ops/{settings.gateway_id}/events"
    async with (
        connected(ctx) as mqtt,
        mqtt_client(variant, variant.gateway_credentials()) as watcher,
    ):
        await watcher.subscribe(topic)
        await watcher.subscribe(events)
        assert mqtt.publish(topic + "\x01", b"poison", qos=1)
        assert mqtt.publish(topic, b"after", qos=1)
        assert await next_payload(watcher, topic) == b"after"
        alarm = json.loads(await first_payload(watcher, events))
        assert alarm["alarm"] == "mqtt_publish_poison"
        assert metric(ctx, 'mqtt_publish_failed_total{reason="poison"}') == 1
        async with asyncio.timeout(WAIT_S):
            await mqtt.wait_connected()
        losses = metric(ctx, 'mqtt_connection_losses_total{how="lost"}')
        assert 1 <= losses <= 3
        assert (
            2 <= mqtt.connection_count <= 1 + losses
        )  # a CONNACK cut before the presence: no count
        await stays_up(mqtt, 2.0)
        assert metric(ctx, 'mqtt_connection_losses_total{how="lost"}') == losses


@pytest.mark.parametrize("variant", [{"deny_subscribe": "snlp/v1/+/rpt"}], indirect=True)
async def test_a_refused_subscription_makes_the_gateway_not_ready(
    variant: Broker, tmp_path: Path, device_id: str
) -> None:
    """MQTT 5 §3.9.3: a SUBACK reason code >= 0x80 refuses that filter alone. The broker denies
    the gateway one of its routes (SUBACK 0x87): its health says not ready naming the filter,
    the alarm goes out on the ops events topic, and the other routes still receive."""
    settings = gateway_settings(variant, tmp_path)
    ctx = Context.create(settings)
    seen: asyncio.Queue[Inbound] = asyncio.Queue(10)
    ctx.mqtt.route("snlp/v1/+/rpt", seen.put_nowait, qos=1)
    ctx.mqtt.route("snlp/v1/+/evt", seen.put_nowait, qos=1)
    events = f"snlpgw/v1/ops/{settings.gateway_id}/events"
    async with mqtt_client(variant, variant.gateway_credentials()) as ops:
        await ops.subscribe(events)
        async with connected(ctx) as mqtt:
            alarm = json.loads(await next_payload(ops, events))
            assert alarm["alarm"] == "mqtt_subscribe_refused"
            assert mqtt.health() == {"ok": False, "refused_subscriptions": ["snlp/v1/+/rpt"]}
            assert mqtt.refused_subscriptions == (("snlp/v1/+/rpt", 0x87),)
            assert metric(ctx, "mqtt_subscriptions_refused") == 1
            await ops.publish(f"snlp/v1/{device_id}/evt", b"heard")
            got = await asyncio.wait_for(seen.get(), WAIT_S)
            assert (got.topic, got.payload) == (f"snlp/v1/{device_id}/evt", b"heard")


async def board_event(watch: ClientSession, dev: str, evt: str, ref: str) -> None:
    """Wait until the broker has the board's event ``evt`` for command ``ref``."""
    topic = f"snlp/v1/{dev}/evt"
    async with asyncio.timeout(WAIT_S):
        while True:
            body = json.loads(await next_payload(watch, topic))
            if (body.get("evt"), body.get("ref")) == (evt, ref):
                return


@pytest.mark.parametrize("kept", [True, False], ids=["kept-session", "clean-session-control"])
async def test_no_board_message_is_lost_across_a_gateway_reconnect(
    broker: Broker, tmp_path: Path, kept: bool
) -> None:
    """MQTT 5 §3.1.2.4 / §4.1: with Clean Start 0 and a Session Expiry Interval the broker
    keeps the gateway's session while it is away and queues its QoS 1 messages; the gateway
    resumes it (``mqtt.session_expiry_s``). The gateway's TCP link to the broker is cut (a
    proxy, not the process) as the board starts playing step 1; the board's completion reaches
    the broker while the gateway is cut off; after the reconnect it is delivered and the lesson
    completes with every step. Control: with ``session_expiry_s`` 0 the same completion is
    lost and the step fails on its watchdog (the test can fail)."""
    async with cut_proxy(broker.host, broker.port) as proxy:
        mqtt: dict[str, object] = {"url": proxy.url}
        if not kept:
            mqtt["session_expiry_s"] = 0
        grace = 5000 if kept else 1500  # the watchdog: the play's duration + this
        async with (
            lesson_rig(
                broker,
                tmp_path,
                durations_ms=(300, 600, 300, 300),
                mqtt=mqtt,
                runtime={"completion_grace_ms": grace},
            ) as rig,
            mqtt_client(broker, broker.gateway_credentials()) as watch,
        ):
            await watch.subscribe(f"snlp/v1/{rig.dev}/evt")
            iid = (await rig.start(priority=2))["instance_id"]
            play = (await rig.wait_command("PLAY_MEDIA", 2))[1]
            proxy.cut()
            await board_event(watch, rig.dev, "audio.completed", play.body["id"])
            assert proxy.live == 0  # the completion reached the broker with the gateway away
            assert rig.find_event("window.opened", 1, instance_id=iid) is None
            proxy.restore()
            if not kept:
                await rig.wait_event("step.failed", 1, instance_id=iid)
                assert rig.find_event("window.opened", 1, instance_id=iid) is None
                return
            await rig.wait_event("instance.completed", instance_id=iid)
            assert rig.gw.service.mqtt.connection_count == 2
            assert rig.find_event("step.failed", instance_id=iid) is None
            for step in range(4):
                assert rig.find_event("window.closed", step, instance_id=iid) is not None
            plays = [p.body["params"]["name"] for p in rig.commands("PLAY_MEDIA")]
            assert plays == [clip_path(c) for c in ("01.mp3", "02.mp3", "03.mp3", "04.mp3")]
