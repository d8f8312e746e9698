"""JSON that decodes but cannot be used: nesting deep enough to exhaust Python's decoder (a
RecursionError, which is no ValueError) and strings holding a lone surrogate (valid as a JSON
``\\udXXX`` escape, but no UTF-8 reply can carry it back). Every JSON the gateway takes from
outside passes one bound in ``topics.wire`` (``MAX_JSON_DEPTH`` = 32, Unicode scalar values
only): HTTP answers 400, MQTT drops the message and counts it under ``too_deep`` or
``invalid_unicode``. Each attack is sent for real: HTTP to the gateway's listeners, MQTT
through the real broker."""

from __future__ import annotations

import asyncio
import json
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.board.device import Device
from gateway.simulators.xiaozhi import XiaozhiDeviceSim
from tests.adversarial.peers import Peer
from tests.adversarial.test_ota_trust import AUTH, TOKEN
from tests.integration.xiaozhi_support import XiaozhiGateway, new_mac, running_gateway
from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import LessonRig, Seen, lesson_rig

pytestmark = pytest.mark.integration

DEEP = b"[" * 1000 + b"]" * 1000  # 2 KB; json.loads raises RecursionError on it
SURROGATE = "\\ud800"  # as it travels: a JSON escape of a lone high surrogate
SENTINEL_UP_MS = 123_456_789
WAIT_S = 30.0


async def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (DEEP, "too_deep"),
        (b'{"mac_address":"' + SURROGATE.encode() + b'"}', "invalid_unicode"),
        (b'{"Payload":{"serial_number":"SN' + SURROGATE.encode() + b'"}}', "invalid_unicode"),
    ],
    ids=["deep", "surrogate", "surrogate_nested"],
)
async def test_unusable_json_bodies_over_http_get_400(
    broker: Broker, body: bytes, reason: str
) -> None:
    """Attack: a client POSTs a JSON body of 1,000 nested arrays (2 KB), or one whose strings hold a lone surrogate, to `/xiaozhi/ota/`, `/xiaozhi/ota/activate` and the admin API's `/admin/devices/approve`.
    Defence: each answers 400 naming the reason (`too_deep`, `invalid_unicode`) instead of 500 from a RecursionError, nothing is provisioned, and a real board provisions right after."""
    async with running_gateway(broker, http={"admin_token": TOKEN}) as gw:
        headers = {"Device-Id": new_mac(), "Client-Id": str(uuid.uuid4())}
        for url in (gw.ota_url, gw.ota_url + "activate"):
            status, answer = await _post(url, body, headers)
            assert (status, reason in answer["error"]) == (400, True), answer
        status, answer = await _post(f"{gw.admin_url}/admin/devices/approve", body, AUTH)
        assert (status, answer["error"], reason in answer["detail"]) == (400, "bad_request", True)
        assert gw.metric("xiaozhi_ota_requests_total", status="500") == 0
        assert gw.metric("xiaozhi_ota_requests_total", status="200") == 0
        board = XiaozhiDeviceSim(mac=new_mac())
        info = await board.provision(gw.ota_url)
        assert info.password


async def _sentinel_hello(gw: XiaozhiGateway, sim: XiaozhiDeviceSim) -> None:
    """The device's next good message is served (and, in order, every earlier one handled)."""
    hello = await sim.open_audio_channel()
    assert gw.channel.session_id(sim.mac.replace(":", "_")) == hello.session_id


async def test_lone_surrogates_and_deep_nesting_from_a_xiaozhi_device_are_counted_drops(
    broker: Broker,
) -> None:
    """Attack: a provisioned Xiaozhi device with an open session sends, on its own `device-server/{dev}` topic, messages whose `session_id`, `abort` reason, or MCP id / method / result hold a lone surrogate (`"\\ud800"`), and a message nested 1,000 levels deep.
    Defence: each is refused at parse time and counted (`xiaozhi_control_dropped_total` `invalid_unicode` / `too_deep`), no handler raises while encoding a reply (`handler_error` stays 0), and the device's next hello is served."""
    async with running_gateway(broker) as gw:
        sim = XiaozhiDeviceSim(mac=new_mac())
        await sim.provision(gw.ota_url)
        async with sim:
            await _sentinel_hello(gw, sim)
            sid = sim.hello.session_id if sim.hello else ""
            bad = [
                {"session_id": SURROGATE, "type": "abort"},
                {"session_id": sid, "type": "abort", "reason": SURROGATE},
                {"session_id": SURROGATE, "type": "listen", "state": "start", "mode": "auto"},
                {"session_id": SURROGATE, "type": "goodbye"},
                {"session_id": sid, "type": "mcp",
                 "payload": {"jsonrpc": "2.0", "id": SURROGATE, "result": {}}},
                {"session_id": sid, "type": "mcp",
                 "payload": {"jsonrpc": "2.0", "method": "notifications/" + SURROGATE}},
                {"session_id": sid, "type": "mcp",
                 "payload": {"jsonrpc": "2.0", "id": 1, "result": {"content": [SURROGATE]}}},
            ]  # fmt: skip
            for message in bad:
                # json.dumps would escape the backslash: splice the escape in as raw text.
                text = json.dumps(message).replace("\\\\ud800", "\\ud800")
                await sim.publish(text.encode())
            await sim.publish(b'{"type":"abort","x":' + DEEP + b"}")
            await _sentinel_hello(gw, sim)
            assert gw.metric("xiaozhi_control_dropped_total", reason="invalid_unicode") == len(bad)
            assert gw.metric("xiaozhi_control_dropped_total", reason="too_deep") == 1
            assert gw.metric("mqtt_messages_in_dropped_total", reason="handler_error") == 0


def _reply_after(rig: LessonRig, seen: int) -> Seen | None:
    return rig.replies[seen] if len(rig.replies) > seen else None


def _served(device: Device | None) -> bool:
    return device is not None and device.up_ms == SENTINEL_UP_MS


async def test_deep_and_surrogate_board_events_and_control_requests_are_counted_drops(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a board with its own credentials publishes snlp/v1 events and heartbeats nested 1,000 levels deep or holding a lone surrogate, and a backend user sends such control requests on `snlpgw/v1/ctl/{dev}`, while another board runs a lesson.
    Defence: the board's messages are dropped and counted (`board_inbound_dropped_total` `too_deep` / `invalid_unicode`), its next heartbeat is served; each control request gets a `refused` reply naming the reason and is counted (`ctl_invalid`); the lesson completes."""
    async with lesson_rig(broker, tmp_path) as rig:
        attacker = new_device_id()
        creds = broker.provision(attacker)
        assert broker.device_port is not None
        device = Peer(broker.host, broker.device_port, creds.username, creds.password, "a")
        device.start()
        try:
            assert await device.wait_connected() == 0
            evt, hb = f"snlp/v1/{attacker}/evt", f"snlp/v1/{attacker}/hb"
            device.publish(evt, b'{"evt":"sd.x","data":' + DEEP + b"}", qos=1)
            device.publish(hb, DEEP, qos=1)
            device.publish(evt, b'{"evt":"button","id":"' + SURROGATE.encode() + b'"}', qos=1)
            device.publish(hb, json.dumps({"v": 1, "up_ms": SENTINEL_UP_MS}).encode(), qos=1)
            async with asyncio.timeout(WAIT_S):  # the attacker's next heartbeat is served
                while not _served(rig.gw.board._devices.get(attacker)):  # noqa: ASYNC110 - the board table has no event to await
                    await asyncio.sleep(0.05)
        finally:
            device.stop()
        dropped = 'board_inbound_dropped_total{{kind="{}",reason="{}"}}'
        assert rig.metric(dropped.format("evt", "too_deep")) == 1
        assert rig.metric(dropped.format("hb", "too_deep")) == 1
        assert rig.metric(dropped.format("evt", "invalid_unicode")) == 1

        for body, reason in (
            (b'{"v":1,"id":"r","action":"stop","params":' + DEEP + b"}", "too_deep"),
            (b'{"v":1,"id":"r' + SURROGATE.encode() + b'","action":"stop"}', "invalid_unicode"),
        ):
            seen = len(rig.replies)
            await rig.backend.publish(f"snlpgw/v1/ctl/{rig.dev}", body)
            refusal = await rig.watch.until(
                partial(_reply_after, rig, seen), f"the reply refusing {reason}"
            )
            assert refusal.body["status"] == "refused"
            assert reason in refusal.body["detail"]
            assert rig.metric(f'ctl_invalid_total{{reason="{reason}"}}') == 1
        started = await rig.start()
        assert started["status"] == "accepted"
        await rig.wait_event("instance.completed", instance_id=started["instance_id"])
        assert rig.metric('mqtt_messages_in_dropped_total{reason="handler_error"}') == 0
