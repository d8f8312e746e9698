"""A control request's MQTT 5 Response Topic is where the gateway publishes its reply: an
attacker with a backend account names topics the gateway must never publish to."""

from __future__ import annotations

import json
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.broker import Broker
from tests.support.lesson_rig import lesson_rig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_response_topics_outside_the_reply_tree_are_not_published_to(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a backend user sends control requests whose MQTT 5 Response Topic is a wildcard (`snlpgw/v1/reply/#`: the broker disconnects any client that publishes to it, so a gateway that obeyed would reconnect forever), a board's command topic (`snlp/v1/{dev}/cmd`: to have the gateway command a board) and another gateway's presence topic.
    Defence: the gateway answers only inside the reply tree backends read (`snlpgw/v1/reply/<one level>`); each other topic is ignored and counted (`ctl_invalid{reason="response_topic"}`), the reply still reaches the device's reply topic, the gateway keeps its one broker connection, the board receives nothing, and a lesson started afterwards runs."""
    async with lesson_rig(broker, tmp_path) as rig:
        mqtt = rig.gw.service.mqtt
        connections = mqtt.connection_count
        creds = broker.provision(f"rt-{rig.dev[-5:].replace('_', '')}", role="backend")
        poison = [
            "snlpgw/v1/reply/#",
            f"snlp/v1/{rig.dev}/cmd",
            "snlpgw/v1/gw/other/status",
        ]
        async with aiomqtt.Client(
            broker.host,
            broker.port,
            username=creds.username,
            password=creds.password,
            identifier=f"{creds.username}-attack",
            protocol=aiomqtt.ProtocolVersion.V5,
        ) as client:
            for i, topic in enumerate(poison):
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.ResponseTopic = topic
                props.CorrelationData = b"attack"
                body = {"v": 1, "id": f"attack-{i}", "action": "stop"}
                await client.publish(
                    f"snlpgw/v1/ctl/{rig.dev}", json.dumps(body), qos=1, properties=props
                )
            await rig.watch.until(
                lambda: (
                    len([r for r in rig.replies if str(r.body.get("ref")).startswith("attack-")])
                    >= len(poison)
                    or None
                ),
                "the attack requests' replies on the device's reply topic",
            )
        invalid = rig.metric('ctl_invalid_total{reason="response_topic"}')
        assert invalid == len(poison)
        assert [
            c for c in rig.board.commands if str(c.body.get("ref", "")).startswith("attack")
        ] == []
        assert mqtt.connection_count == connections  # no reconnect, let alone a loop
        reply = await rig.start()
        assert reply["status"] == "accepted", reply
        await rig.wait_event("instance.completed", instance_id=reply["instance_id"], wait_s=60)
