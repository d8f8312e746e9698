"""Client-id takeover on the real broker: Mosquitto disconnects a client when another connects
with the same client id, so a device that could pick the gateway's or another board's id would
knock it off. Devices use the device listener (client id := user name) and the gateway's id
carries a secret suffix."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gateway.broker.credentials import Credentials
from tests.adversarial.peers import Peer, wait_for
from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import lesson_rig

pytestmark = pytest.mark.integration


def device_peer(
    broker: Broker, creds: Credentials, client_id: str, *, device_listener: bool = True
) -> Peer:
    port = broker.device_port if device_listener else broker.port
    assert port is not None
    return Peer(broker.host, port, creds.username, creds.password, client_id)


async def test_device_cannot_displace_the_gateway_with_its_client_id(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a device connects with the gateway's client id (the real one on the device listener, the old guessable `snlpgw-<id>` on the gateway's) while a lesson runs.
    Defence: the device listener renames the device to its user name and the real id has a secret suffix, so the gateway keeps its one connection and the lesson completes."""
    async with lesson_rig(broker, tmp_path) as rig:
        mqtt = rig.gw.service.mqtt
        gw_id = rig.settings.gateway_id
        assert mqtt.client_id.startswith(f"snlpgw-{gw_id}-")
        assert len(mqtt.client_id) >= len(f"snlpgw-{gw_id}-") + 20
        attacker = broker.provision(new_device_id())
        leaked = device_peer(broker, attacker, mqtt.client_id)
        guessed = device_peer(broker, attacker, f"snlpgw-{gw_id}", device_listener=False)
        peers = [leaked, guessed]
        try:
            for peer in peers:
                peer.start()
                assert await peer.wait_connected() == 0  # the broker accepted the attacker
            reply = await rig.start()
            assert reply["status"] == "accepted"
            await rig.wait_event("instance.completed", instance_id=reply["instance_id"])
            assert mqtt.connected
            assert mqtt.connection_count == 1, "the gateway was disconnected and reconnected"
            assert rig.metric("mqtt_connects_total") == 1
            assert not leaked.dropped.is_set()
            assert not guessed.dropped.is_set()
        finally:
            for peer in peers:
                peer.stop()


async def test_device_cannot_kick_another_device(broker: Broker) -> None:
    """Attack: device A connects to the device listener with device B's client id, first the `GID_…@@@B@@@uuid` id the OTA gave B, then B's bare device id.
    Defence: the broker replaces A's client id with A's user name, so B stays connected and keeps receiving its commands (only A's own earlier connection is displaced)."""
    victim_dev, attacker_dev = new_device_id(), new_device_id()
    victim_id = f"GID_snlp@@@{victim_dev}@@@{uuid.uuid4()}"
    attacker = broker.provision(attacker_dev)
    victim = device_peer(broker, broker.provision(victim_dev), victim_id)
    first = device_peer(broker, attacker, victim_id)
    second = device_peer(broker, attacker, victim_dev)
    gateway = broker.gateway_credentials()
    sender = Peer(
        broker.host,
        broker.port,
        gateway.username,
        gateway.password,
        f"test-sender-{uuid.uuid4().hex[:8]}",
        mqtt5=True,
    )
    peers = [victim, first, second, sender]
    try:
        victim.start()
        assert await victim.wait_connected() == 0
        await victim.subscribe(f"snlp/v1/{victim_dev}/cmd")
        first.start()
        assert await first.wait_connected() == 0
        second.start()
        assert await second.wait_connected() == 0
        # Both attacker connections ran as "attacker_dev": the second displaced the first.
        # That is the kick the attack aimed at the victim, landing on the attacker itself.
        await wait_for(first.dropped, "the attacker's first connection displaced")
        sender.start()
        assert await sender.wait_connected() == 0
        sender.publish(f"snlp/v1/{victim_dev}/cmd", b'{"probe":1}', qos=1)
        await wait_for(victim.got_message, "the victim's command")
        assert victim.messages == [(f"snlp/v1/{victim_dev}/cmd", b'{"probe":1}')]
        assert not victim.dropped.is_set()
        assert not second.dropped.is_set()
    finally:
        for peer in peers:
            peer.stop()
