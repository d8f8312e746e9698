"""End to end over the real broker and real UDP: OTA → MQTT with the returned credentials →
hello → firmware-validated reply → real speech as encrypted Opus → VAD utterances with the
right boundaries → goodbye from either side; downlink audio paced to the device."""

from __future__ import annotations

import argparse
import asyncio
import wave
from pathlib import Path

import aiohttp
import pytest

from gateway.mqtt.probe import connack
from gateway.simulators.xiaozhi import (
    XiaozhiDeviceSim,
    add_xiaozhi_simulator_command,
    encode_pcm,
    parse_server_hello,
    simulate,
)
from gateway.xiaozhi.mcp import McpError
from tests.integration.xiaozhi_support import (
    XiaozhiGateway,
    new_mac,
    provisioned_device,
    running_gateway,
)
from tests.support import speech
from tests.support.broker import Broker
from tests.support.udp_watch import DatagramWatch
from topics.xiaozhi import firmware_accepts_hello

pytestmark = pytest.mark.integration

BOUNDARY_MS = 150

TWENTY_SECONDS = [
    800,
    "Good morning, how are you today?",
    1500,
    "I would like to read a book about the ocean.",
    1500,
    "The little turtle swims to the island.",
    1500,
    "Can you count from one to ten with me?",
    1500,
    "Thank you very much, see you tomorrow.",
    1500,
    "Please close the door.",
    1200,
]


def assert_boundaries(gw: XiaozhiGateway, dev: str, timeline: speech.Timeline) -> None:
    found = gw.recorder.utterances_of(dev)
    assert len(found) == len(timeline.utterances), [(u.start_ms, u.end_ms) for u in found]
    for got, want in zip(found, timeline.utterances, strict=True):
        assert abs(got.start_ms - want.start_ms) <= BOUNDARY_MS, (want.text, got, want)
        assert abs(got.end_ms - want.end_ms) <= BOUNDARY_MS, (want.text, got, want)


async def test_ota_hello_speech_goodbye(broker: Broker) -> None:
    timeline = speech.compose(TWENTY_SECONDS)
    assert timeline.duration_ms >= 20_000
    async with running_gateway(broker) as gw:
        mac = new_mac()
        dev = mac.replace(":", "_")
        sim = XiaozhiDeviceSim(mac=mac, board="bread compact:wifi")
        info = await sim.provision(gw.ota_url)
        assert info.username == dev
        assert info.client_id.startswith(f"GID_bread_compact_wifi@@@{dev}@@@")
        assert info.client_id.endswith(sim.uuid)
        assert (info.publish_topic, info.subscribe_topic) == (
            f"device-server/{dev}",
            f"devices/p2p/{dev}",
        )
        # No ota_mqtt_endpoint: OTA sends boards to the device listener, never the gateway's.
        assert info.endpoint == f"127.0.0.1:{broker.device_port}"
        assert not info.tls
        async with sim:  # the returned credentials work at once
            hello = await sim.open_audio_channel()
            raw_reply = next(m for m in sim.inbox if m["type"] == "hello")
            assert parse_server_hello(raw_reply) == hello  # the simulator's firmware mirror
            assert firmware_accepts_hello(raw_reply)  # the wire contract's mirror (topics)
            assert hello.nonce == b"\x01\x00\x00\x00" + hello.nonce[4:8] + bytes(8)
            assert (hello.sample_rate, hello.frame_duration) == (16000, 60)
            assert (hello.server, hello.port) == ("127.0.0.1", gw.channel.udp_port)
            await sim.listen_start("auto")
            await gw.recorder.wait_for(
                lambda: ("listen", dev, "start", "auto") in gw.recorder.events
            )
            sent = await sim.stream_pcm(timeline.pcm, speed=10)
            await gw.recorder.wait_for(
                lambda: len(gw.recorder.utterances_of(dev)) >= len(timeline.utterances)
            )
            assert_boundaries(gw, dev, timeline)
            assert gw.metric("xiaozhi_opus_frames_decoded_total") > 0
            assert gw.metric("xiaozhi_vad_segments_total") == len(timeline.utterances)
            await sim.goodbye()
            await gw.recorder.wait_for(lambda: gw.channel.session_id(dev) is None)
        # Every datagram was in the gateway's socket before the goodbye left the device.
        assert gw.metric("xiaozhi_udp_packets_in_total") == sent
        assert gw.metric("xiaozhi_udp_dropped_total", reason="replay") == 0
        assert ("closed", dev, hello.session_id, "device_goodbye") in gw.recorder.events
        assert gw.metric("xiaozhi_goodbyes_total", side="device", reason="device_goodbye") == 1
        assert gw.metric("xiaozhi_sessions") == 0


async def test_realtime_stream_and_gateway_goodbye(broker: Broker) -> None:
    timeline = speech.compose([500, "Hello there.", 1000, "Nice to meet you.", 900])
    async with running_gateway(broker) as gw:
        async with provisioned_device(gw) as (dev, sim):
            hello = await sim.open_audio_channel()
            await sim.listen_start("manual")
            await sim.stream_pcm(timeline.pcm, speed=1)
            await gw.recorder.wait_for(
                lambda: len(gw.recorder.utterances_of(dev)) >= len(timeline.utterances)
            )
            assert_boundaries(gw, dev, timeline)
            assert gw.channel.close_session(dev)
            goodbye = await sim.expect("goodbye")
            assert goodbye == {"type": "goodbye", "session_id": hello.session_id}
            assert sim.speaking is False
        assert gw.metric("xiaozhi_goodbyes_total", side="gateway", reason="gateway_goodbye") == 1


async def test_downlink_audio_is_paced_after_tts_start(broker: Broker) -> None:
    packets = encode_pcm(speech.synthesize("This is the gateway speaking."))
    async with running_gateway(broker) as gw:
        async with provisioned_device(gw) as (dev, sim):
            await sim.open_audio_channel()
            await sim.listen_start()
            await sim.stream_opus(encode_pcm(speech.silence(180)), speed=10)
            result = await gw.channel.speak(dev, packets)
            assert (result.sent, result.dropped) == (len(packets), 0)
            await sim.expect("tts", state="stop")
            await sim.wait_audio(len(packets), timeout_s=30.0)  # UDP and MQTT: two sockets
            assert sim.downlink_audio == packets  # every frame, in order, decrypted exactly
            assert sim.downlink_discarded == 0
            assert sim.crypto is not None
            assert sim.crypto.remote_sequence == len(packets)  # sequences 1..n
            assert sim.crypto.drops == {}
            kinds = [(m["type"], m.get("state")) for m in sim.inbox]
            assert kinds.index(("tts", "start")) < kinds.index(("tts", "stop"))
        assert gw.metric("xiaozhi_udp_packets_out_total") == len(packets)


async def test_new_hello_replaces_session_and_stale_messages_get_goodbye(broker: Broker) -> None:
    async with running_gateway(broker) as gw, provisioned_device(gw) as (dev, sim):
        first = await sim.open_audio_channel()
        second = await sim.open_audio_channel()  # firmware re-hellos after 120 s idle
        assert first.session_id != second.session_id
        assert first.key != second.key
        assert gw.channel.session_id(dev) == second.session_id
        await sim.publish(
            f'{{"session_id":"{first.session_id}","type":"listen","state":"start","mode":"auto"}}'
        )
        reply = await sim.expect("goodbye")
        assert reply == {"type": "goodbye", "session_id": first.session_id}
        assert gw.channel.session_id(dev) == second.session_id  # current session untouched


async def test_ota_refuses_bad_requests(broker: Broker) -> None:
    async with (
        running_gateway(broker, production_provisioner=True) as gw,
        aiohttp.ClientSession() as http,
    ):
        good = {"Client-Id": "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "User-Agent": "b/1"}
        cases = [
            ({**good}, b"", "missing Device-Id"),
            ({**good, "Device-Id": "zz:zz"}, b"", "malformed Device-Id"),
            ({**good, "Device-Id": "ff:ff:ff:ff:ff:ff"}, b"", "unknown Device-Id"),
            ({"Device-Id": new_mac()}, b"", "Client-Id"),
            (
                {**good, "Device-Id": new_mac()},
                b'{"mac_address":"02:00:00:00:00:01"}',
                "does not match",
            ),
        ]
        for headers, body, message in cases:
            async with http.post(gw.ota_url, headers=headers, data=body) as resp:
                assert resp.status == 400
                assert message in (await resp.json())["error"]
        mac = new_mac()
        async with http.get(gw.ota_url, headers={**good, "Device-Id": mac}) as resp:
            assert resp.status == 200  # firmware sends GET when its body is empty
            body = await resp.json()
        assert "activation" not in body
        # The production provisioner reloaded the broker itself: the password works at once.
        mqtt = body["mqtt"]
        code = connack(broker.host, broker.port, mqtt["username"], mqtt["password"])
        assert code == 0
        assert gw.metric("xiaozhi_ota_requests_total", status="400") == len(cases)


async def test_idle_session_is_closed_with_goodbye(broker: Broker) -> None:
    async with running_gateway(broker, session_idle_s=0.3) as gw:
        mac = new_mac()
        sim = XiaozhiDeviceSim(mac=mac)
        await sim.provision(gw.ota_url)
        async with sim:
            hello = await sim.open_audio_channel()
            goodbye = await sim.expect("goodbye", timeout_s=10)
            assert goodbye == {"type": "goodbye", "session_id": hello.session_id}
            assert gw.channel.session_id(mac.replace(":", "_")) is None
        assert gw.metric("xiaozhi_goodbyes_total", side="gateway", reason="idle") == 1


async def test_simulate_command_streams_a_wav(broker: Broker, tmp_path: Path) -> None:
    timeline = speech.compose([300, "Hello from the command line.", 700])
    wav_path = tmp_path / "speech.wav"
    with wave.open(str(wav_path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(timeline.pcm)
    parser = argparse.ArgumentParser()
    add_xiaozhi_simulator_command(parser.add_subparsers(dest="what", required=True))
    async with running_gateway(broker) as gw:
        args = parser.parse_args(
            ["xiaozhi", "--ota-url", gw.ota_url, "--wav", str(wav_path), "--mac", new_mac(),
             "--speed", "10", "--linger-s", "0"]
        )  # fmt: skip
        result = await simulate(args)
        dev = result["device"].replace(":", "_")
        await gw.recorder.wait_for(lambda: len(gw.recorder.utterances_of(dev)) >= 1)
        await gw.recorder.wait_for(lambda: gw.channel.session_id(dev) is None)
    assert result["frames_sent"] == len(encode_pcm(timeline.pcm))
    assert result["messages_received"][0] == "hello"
    assert_boundaries(gw, dev, timeline)


async def test_goodbye_right_after_speech_keeps_the_last_utterance(broker: Broker) -> None:
    timeline = speech.compose([300, "See you later."])  # no trailing silence at all
    async with running_gateway(broker) as gw:
        async with provisioned_device(gw) as (dev, sim):
            await sim.open_audio_channel()
            await sim.listen_start("manual")
            await sim.stream_pcm(timeline.pcm, speed=10)
            await sim.goodbye()
            await gw.recorder.wait_for(lambda: gw.channel.session_id(dev) is None)
        assert_boundaries(gw, dev, timeline)


async def test_a_goodbye_does_not_overtake_the_frames_sent_before_it(broker: Broker) -> None:
    """The goodbye travels over MQTT, the frames before it over UDP, where the gateway reads on
    a timer while datagrams flow (here 3 s, so the goodbye always arrives first). The control
    message reads what waits in the socket before it ends the session: every frame is decoded
    and the utterance kept, none is dropped as a stray of a closed session."""
    timeline = speech.compose([300, "See you later."])
    packets = encode_pcm(timeline.pcm)
    async with running_gateway(broker, udp_coalesce_s=3.0) as gw:
        async with provisioned_device(gw) as (dev, sim):
            await sim.open_audio_channel()
            await sim.listen_start("manual")
            assert sim.crypto is not None
            watch = DatagramWatch(gw.channel)
            sim.send_datagram(sim.crypto.seal(packets[0]))
            # Read on readiness; from now on the endpoint reads again only after 3 s.
            await watch.until(lambda: gw.metric("xiaozhi_udp_packets_in_total") == 1)
            for packet in packets[1:]:
                sim.send_datagram(sim.crypto.seal(packet))
            await sim.goodbye()
            await gw.recorder.wait_for(lambda: gw.channel.session_id(dev) is None)
            assert gw.metric("xiaozhi_udp_packets_in_total") == len(packets)
        assert gw.metric("xiaozhi_udp_dropped_total", reason="unknown_ssrc") == 0
        assert gw.metric("xiaozhi_opus_frames_decoded_total") == len(packets)
        assert_boundaries(gw, dev, timeline)


async def test_not_listening_skips_decoding_but_keeps_stream_time(broker: Broker) -> None:
    ignored = speech.compose([300, "Nobody needs this part.", 600])
    heard = speech.compose([400, "But this part counts.", 900])
    async with running_gateway(broker) as gw:
        mac = new_mac()
        dev = mac.replace(":", "_")
        gw.channel.set_listening(dev, False)  # before the session exists: remembered
        sim = XiaozhiDeviceSim(mac=mac)
        await sim.provision(gw.ota_url)
        async with sim:
            await sim.open_audio_channel()
            await sim.listen_start()
            skipped = await sim.stream_pcm(ignored.pcm, speed=10)
            # Barrier: this control message goes through the broker, so it reaches the gateway
            # after the datagrams sent before it (the loop keeps up with 10x real time).
            await sim.listen_start()
            await gw.recorder.wait_for(
                lambda: gw.recorder.events.count(("listen", dev, "start", "auto")) == 2
            )
            gw.channel.set_listening(dev, True)
            await sim.stream_pcm(heard.pcm, speed=10)
            await gw.recorder.wait_for(lambda: len(gw.recorder.utterances_of(dev)) >= 1)
        offset_ms = skipped * 60  # frame k covers [(k-1)*60, k*60) ms of the session
        shifted = speech.Timeline(
            heard.pcm,
            tuple(
                speech.Utterance(u.text, u.start_ms + offset_ms, u.end_ms + offset_ms)
                for u in heard.utterances
            ),
        )
        assert_boundaries(gw, dev, shifted)
        assert gw.metric("xiaozhi_opus_frames_skipped_total") == skipped
        assert gw.metric("xiaozhi_udp_dropped_total", reason="replay") == 0


async def test_mcp_requests_reach_the_device_and_come_back(broker: Broker) -> None:
    async with running_gateway(broker) as gw:
        mac = new_mac()
        dev = mac.replace(":", "_")
        sim = XiaozhiDeviceSim(mac=mac, board="bread")
        await sim.provision(gw.ota_url)
        async with sim:
            # MCP flows without an audio session (session_id "").
            init = await gw.channel.mcp_request(dev, "initialize", {"capabilities": {}})
            assert init["serverInfo"]["name"] == "bread"
            await sim.open_audio_channel()
            # No server holds the session: the gateway asks the device's tools itself at
            # connect (docs/chat.md); counted below once its answer is kept.
            async with asyncio.timeout(10):
                while (kept := gw.channel.control.status.get(dev)) is None or kept.tools_at is None:  # noqa: ASYNC110 - no event; bounded
                    await asyncio.sleep(0.02)
            tools = await gw.channel.mcp_request(dev, "tools/list", {"cursor": ""})
            assert [t["name"] for t in tools["tools"]] == ["self.get_device_status"]
            with pytest.raises(McpError, match="Unknown method"):
                await gw.channel.mcp_request(dev, "resources/list", timeout_s=5)
            gw.channel.mcp_notify(dev, "notifications/initialized")
            called = await gw.channel.mcp_request(
                dev, "tools/call", {"name": "self.get_device_status", "arguments": {}}
            )
            assert called["isError"] is False
        assert gw.metric("xiaozhi_mcp_requests_total", outcome="ok") == 4  # with the connect's
        assert gw.metric("xiaozhi_mcp_requests_total", outcome="error") == 1
