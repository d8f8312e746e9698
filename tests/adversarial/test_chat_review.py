"""CHAT bridge attacks found in review: one device failing its own upstream link on purpose
must not hold back every other device's chat (the upstream back-off is shared)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gateway.simulators.xiaozhi import MqttInfo, XiaozhiDeviceSim, hello_json
from tests.support.broker import Broker
from tests.support.chat_rig import chat_rig
from topics import mac_colon

pytestmark = pytest.mark.integration

VICTIM = "24_0a_c4_77_00_01"
FLOOD = 70  # past the upstream link's control_capacity (64)


async def test_one_devices_control_flood_does_not_hold_back_anothers_chat(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a device in a bridged chat publishes more control messages than its upstream link may queue, so its link fails (`control_overflow`), hoping the shared upstream back-off then refuses every other device's chat.
    Defence: only the flooding device's link ends (goodbye, counted); the back-off is for the upstream server failing, so another device's hello right after is bridged at once."""
    async with chat_rig(broker, tmp_path, backoff_min_s=30.0, backoff_max_s=30.0) as rig:
        peer, attacker = rig.upstream, rig.device
        victim = _device(broker, VICTIM)
        async with victim:
            peer.answer_hellos.clear()  # the attacker's link stays not ready while it floods
            # Its hello reply is held until the server's hello (docs/chat.md): the attacker
            # floods before it, as a device may (the firmware sends MCP as soon as it is up).
            await attacker.publish(hello_json())
            await peer.wait_for(
                lambda: bool(peer.sessions) and peer.sessions[0].hello is not None,
                "attacker's upstream hello",
            )
            for n in range(FLOOD):
                await attacker.send_json(type="mcp", payload={"jsonrpc": "2.0", "id": n})
            # A listen for a session that does not exist is answered with a goodbye naming it,
            # in order after the flood: once it is back, every mcp was queued on the link.
            await attacker.publish('{"session_id":"stale-1","type":"listen","state":"stop"}')
            await attacker.expect("goodbye", session_id="stale-1")
            seen = len(attacker.inbox)
            peer.answer_hellos.set()
            await attacker.expect("goodbye", after=seen)  # its own link failed: its hello ends
            assert rig.lesson.metric('chat_upstream_ends_total{reason="control_overflow"}') == 1

            await victim.open_audio_channel()
            await peer.session(1)  # bridged: the victim's hello reached the upstream
            assert rig.lesson.metric('chat_upstream_ends_total{reason="backoff"}') == 0


def _device(broker: Broker, dev: str) -> XiaozhiDeviceSim:
    creds = broker.provision(dev)
    sim = XiaozhiDeviceSim(mac=mac_colon(dev))
    sim.mqtt_info = MqttInfo(
        endpoint=f"{broker.host}:{broker.port}",
        client_id=f"GID_test@@@{dev}@@@{uuid.uuid4()}",
        username=dev,
        password=creds.password or "",
        publish_topic=f"device-server/{dev}",
        subscribe_topic=f"devices/p2p/{dev}",
    )
    return sim


async def test_devices_that_left_do_not_keep_new_ones_out_of_chat(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: more devices than the chat table holds (`MAX_DEVICES`, 10,000: a day of a large fleet, or users minted over OTA) say hello and leave one after another, so every later device finds the table full.
    Defence: a device with no open session is evicted (its tasks ended) when a new one needs room, so the new device is bridged as usual."""
    monkeypatch.setattr("gateway.chat.component.MAX_DEVICES", 2)
    async with chat_rig(broker, tmp_path) as rig:
        peer = rig.upstream
        others = [_device(broker, f"24_0a_c4_78_00_0{n}") for n in (1, 2)]
        async with others[0], others[1]:
            for index, sim in enumerate([rig.device, others[0]]):
                await sim.open_audio_channel()
                await peer.session(index)
                await sim.send_json(type="goodbye")
                # answered in order after the goodbye: the session is closed by then
                await sim.publish('{"session_id":"stale-2","type":"listen","state":"stop"}')
                await sim.expect("goodbye", session_id="stale-2")
            await others[1].open_audio_channel()
            await peer.session(2)  # the third device is bridged: the table made room
            chat = rig.lesson.gw.chat
            assert chat is not None
            assert chat.device(rig.dev) is None  # the first to leave was evicted
