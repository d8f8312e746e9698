"""The service skeleton against a real Mosquitto: presence, metrics, reconnect, shutdown."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

from devstack.gateway import gateway_settings, serving
from gateway.mqtt.edge import Inbound
from gateway.service import Context, Service
from tests.support.broker import Broker
from tests.support.mqtt_client import mqtt_client
from topics import GatewayStatus, OpsMetrics, TopicKind, build_topic


class ServiceProbe:
    """A component that records what its route receives."""

    name = "probe"

    def __init__(self, ctx: Context, topic_filter: str) -> None:
        self.filter = topic_filter
        self.seen: asyncio.Queue[Inbound] = asyncio.Queue(100)
        ctx.mqtt.route(self.filter, self.seen.put_nowait, qos=1)

    async def run(self) -> None:
        await asyncio.Event().wait()


async def test_ops_user_receives_retained_metrics_and_presence(
    broker: Broker, tmp_path: Path
) -> None:
    settings = gateway_settings(broker, tmp_path)
    gw = settings.gateway_id
    ops = broker.provision(f"ops-{gw}", role="ops")
    async with serving(Service(Context.create(settings))), mqtt_client(broker, ops) as client:
        await client.subscribe(build_topic(TopicKind.OPS_METRICS, gw=gw))
        await client.subscribe(build_topic(TopicKind.GW_STATUS, gw=gw))
        status = await client.expect(build_topic(TopicKind.GW_STATUS, gw=gw))
        assert GatewayStatus.model_validate_json(status.payload).online is True
        snap = await client.expect(build_topic(TopicKind.OPS_METRICS, gw=gw))
        metrics = OpsMetrics.model_validate_json(snap.payload)
        assert metrics.gateway_id == gw
        assert metrics.metrics["snlpgw_mqtt_connected"] == 1.0
    async with mqtt_client(broker, ops) as client:
        await client.subscribe(build_topic(TopicKind.GW_STATUS, gw=gw))
        retained = await client.expect(build_topic(TopicKind.GW_STATUS, gw=gw))
        assert retained.retain
        assert json.loads(retained.payload)["online"] is False  # graceful stop, not the LWT


async def test_broker_restart_reconnects_resubscribes_and_republishes(
    fresh_broker: Broker, tmp_path: Path, device_id: str
) -> None:
    settings = gateway_settings(fresh_broker, tmp_path)
    gw = settings.gateway_id
    ctx = Context.create(settings)
    probe = ServiceProbe(ctx, f"snlp/v1/{device_id}/evt")
    device = fresh_broker.provision(device_id)
    ops = fresh_broker.provision(f"ops-{gw}", role="ops")
    async with serving(Service(ctx, [probe])) as svc:
        async with mqtt_client(fresh_broker, device) as board:
            await board.publish(f"snlp/v1/{device_id}/evt", b"before")
            assert (await asyncio.wait_for(probe.seen.get(), 5)).payload == b"before"

        fresh_broker.stop()
        async with asyncio.timeout(5):
            await svc.mqtt.wait_disconnected()
        fresh_broker.start()
        async with asyncio.timeout(10):
            await svc.mqtt.wait_connected()
        assert svc.mqtt.connection_count == 2

        async with mqtt_client(fresh_broker, device) as board:
            await board.publish(f"snlp/v1/{device_id}/evt", b"after")
            # The broker kept the gateway's session over its restart (persistence): "before",
            # if its PUBACK had not reached the broker when it stopped, comes again first.
            seen = [(await asyncio.wait_for(probe.seen.get(), 5)).payload]
            if seen[0] == b"before":
                seen.append((await asyncio.wait_for(probe.seen.get(), 5)).payload)
            assert seen[-1] == b"after"
        async with mqtt_client(fresh_broker, ops) as client:
            await client.subscribe(build_topic(TopicKind.GW_STATUS, gw=gw))
            await client.subscribe(build_topic(TopicKind.OPS_METRICS, gw=gw))
            status = await client.expect(build_topic(TopicKind.GW_STATUS, gw=gw))
            assert json.loads(status.payload)["online"] is True
            first = await client.expect(build_topic(TopicKind.OPS_METRICS, gw=gw))
            fresh = await client.expect(build_topic(TopicKind.OPS_METRICS, gw=gw))
            assert json.loads(fresh.payload)["ts"] > json.loads(first.payload)["ts"]
            assert json.loads(fresh.payload)["metrics"]["snlpgw_mqtt_connects_total"] == 2.0


async def test_crash_leaves_the_lwt_offline(fresh_broker: Broker, tmp_path: Path) -> None:
    """A gateway that vanishes without DISCONNECT is announced offline by the broker."""
    settings = gateway_settings(fresh_broker, tmp_path, mqtt={"keepalive_s": 5})
    gw = settings.gateway_id
    ops = fresh_broker.provision(f"ops-{gw}", role="ops")
    async with (
        serving(Service(Context.create(settings))) as svc,
        mqtt_client(fresh_broker, ops) as watcher,
    ):
        topic = build_topic(TopicKind.GW_STATUS, gw=gw)
        await watcher.subscribe(topic)
        assert json.loads((await watcher.expect(topic)).payload)["online"] is True
        client = svc.mqtt._client
        assert client is not None
        client.abort()  # a dead link: no DISCONNECT reaches the broker
        offline = json.loads((await watcher.expect(topic, wait_s=10)).payload)
        assert offline["online"] is False
        online_again = json.loads((await watcher.expect(topic, wait_s=10)).payload)
        assert online_again["online"] is True  # and the gateway came back by itself


async def test_a_burst_of_publishes_reaches_a_board_complete_and_in_order(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    """Many QoS 1 publishes in flight at once (mqtt.max_inflight) keep their order end to end."""
    settings = gateway_settings(broker, tmp_path, mqtt={"max_inflight": 20})
    board = broker.provision(device_id)
    topic = f"snlp/v1/{device_id}/cmd"
    async with (
        serving(Service(Context.create(settings))) as svc,
        mqtt_client(broker, board) as client,
    ):
        await client.subscribe(topic)
        for i in range(500):
            svc.mqtt.publish(topic, str(i), qos=1)
        got = [int((await client.expect(topic)).payload) for _ in range(500)]
        assert got == list(range(500))
        # A publish counts once its PUBACK is handled, which may come after the board has it:
        # look again after each loop turn (bounded), the PUBACKs are already on their way.
        for _ in range(10_000):
            if svc.metrics.snapshot()["snlpgw_mqtt_messages_out_total"] >= 500:
                break
            await asyncio.sleep(0.001)
        assert svc.metrics.snapshot()["snlpgw_mqtt_messages_out_total"] >= 500


async def test_the_service_freezes_its_start_up_heap_and_times_collections(
    broker: Broker, tmp_path: Path
) -> None:
    """``ops.gc_freeze`` and ``ops.gc_thresholds`` (on by default; the test tuning leaves the
    test process's collector alone): the heap built before the service runs is frozen out of
    the collector, its thresholds are set, and collections are timed as metrics."""
    settings = gateway_settings(
        broker, tmp_path, ops={"gc_freeze": True, "gc_thresholds": (700, 100, 10)}
    )
    assert gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    assert thresholds != (700, 100, 10)  # the test tuning leaves pytest's
    try:
        async with serving(Service(Context.create(settings))) as service:
            assert gc.get_freeze_count() > 10_000
            assert gc.get_threshold() == (700, 100, 10)
            gc.collect()
            snap = service.metrics.snapshot()
            assert snap['snlpgw_gc_full_pause_ms{stat="count"}'] >= 1.0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
