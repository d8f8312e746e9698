"""Hijack, replay and flood attempts over the real broker and real UDP: each fails, each is
counted, and the victims' audio still comes out of the VAD exactly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import struct
from pathlib import Path

import aiomqtt
import pytest

from gateway.broker.credentials import Credentials
from gateway.broker.rules import Role
from gateway.mqtt.probe import connack
from gateway.simulators.xiaozhi import XiaozhiDeviceSim, encode_pcm
from tests.integration.test_xiaozhi_audio import assert_boundaries
from tests.integration.xiaozhi_support import XiaozhiGateway, new_mac, running_gateway
from tests.support import speech
from tests.support.broker import Broker
from tests.support.mqtt_client import mqtt_client, publish_reason_code
from tests.support.udp_watch import DatagramWatch

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 135
FLOOD_BURST = 200  # datagrams sent before waiting for the gateway to read them


async def connected_sim(gw: XiaozhiGateway) -> XiaozhiDeviceSim:
    sim = XiaozhiDeviceSim(mac=new_mac())
    await sim.provision(gw.ota_url)
    return sim


def dev_of(sim: XiaozhiDeviceSim) -> str:
    return sim.mac.replace(":", "_")


async def test_replay_foreign_source_and_random_ssrc_never_reach_a_pipeline(
    broker: Broker,
) -> None:
    timeline = speech.compose([400, "One two three.", 900, "Four five six.", 900])
    async with running_gateway(broker) as gw:
        watch = DatagramWatch(gw.channel)
        victim, bystander = await connected_sim(gw), await connected_sim(gw)
        async with victim, bystander:
            hello = await victim.open_audio_channel()
            await bystander.open_audio_channel()
            await victim.listen_start()
            await bystander.listen_start()
            assert victim.crypto is not None
            packets = encode_pcm(timeline.pcm)
            attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attacker.setblocking(False)
            target = (hello.server, hello.port)
            captured: list[bytes] = []
            replays = foreign = randoms = 0
            with attacker:
                for index, packet in enumerate(packets):
                    datagram = victim.crypto.seal(packet)
                    victim.send_datagram(datagram)
                    captured.append(datagram)
                    if index % 10 == 5:
                        victim.send_datagram(captured[index // 2])  # replay from the bound address
                        replays += 1
                        attacker.sendto(datagram, target)  # same bytes, second address
                        # An attacker that knows the key and ssrc, forging the next sequence.
                        forged = bytearray(victim.crypto.seal(b"\xfc\xff\xfe"))
                        victim.crypto.local_sequence -= 1
                        attacker.sendto(bytes(forged), target)
                        foreign += 2
                        ssrc = secrets.randbits(32)
                        attacker.sendto(
                            struct.pack(">BBHIII", 1, 0, 3, ssrc, 0, 1) + b"abc", target
                        )
                        randoms += 1
                    if index % 8 == 7:
                        await asyncio.sleep(0.005)
                bystander_packets = await bystander.stream_pcm(timeline.pcm, speed=10)
            await gw.recorder.wait_for(
                lambda: (
                    len(gw.recorder.utterances_of(dev_of(victim))) >= 2
                    and len(gw.recorder.utterances_of(dev_of(bystander))) >= 2
                )
            )
            assert_boundaries(gw, dev_of(victim), timeline)
            assert_boundaries(gw, dev_of(bystander), timeline)
            # Every datagram read before the goodbyes: the utterances end 300 ms into the last
            # silence, and the rest of it, still in the socket when a goodbye closed the
            # session, would count as unknown_ssrc (one did, on two loaded cores).
            sent = len(packets) + bystander_packets + replays + foreign + randoms
            await watch.until(lambda: gw.metric("xiaozhi_udp_packets_in_total") >= sent)
            await victim.goodbye()
            await bystander.goodbye()
            await gw.recorder.wait_for(lambda: gw.metric("xiaozhi_sessions") == 0)
        assert gw.metric("xiaozhi_udp_dropped_total", reason="replay") == replays
        assert gw.metric("xiaozhi_udp_dropped_total", reason="foreign_source") == foreign
        # Random ssrcs may (with probability ~2^-31) hit a live session; they then count as
        # foreign sources instead.
        assert gw.metric("xiaozhi_udp_dropped_total", reason="unknown_ssrc") == randoms
        accepted = len(packets) + bystander_packets
        assert gw.metric("xiaozhi_udp_packets_in_total") == accepted + replays + foreign + randoms


async def test_another_device_cannot_hello_or_listen_as_the_first(broker: Broker) -> None:
    async with running_gateway(broker) as gw:
        victim, intruder = await connected_sim(gw), await connected_sim(gw)
        victim_dev = dev_of(victim)
        async with victim, intruder:
            hello = await victim.open_audio_channel()
            hellos_before = gw.metric("xiaozhi_hellos_total")
            assert intruder.mqtt_info is not None
            assert victim.mqtt_info is not None
            # MQTT 5 PUBACK shows the ACL refusal; the 3.1.1 client's publish is dropped silently.
            # (The intruder's OTA credentials, as its OTA answer gave them.)
            info = intruder.mqtt_info
            creds = Credentials(info.username, info.password, Role.DEVICE, None, (), ())
            assert (
                publish_reason_code(
                    broker, creds, f"device-server/{victim_dev}", b'{"type":"hello"}'
                )
                == NOT_AUTHORIZED
            )
            await intruder.publish(
                b'{"type":"hello","version":3,"transport":"udp"}',
                topic=f"device-server/{victim_dev}",
            )
            # Nor log in as the victim with its own password.
            assert connack(broker.host, broker.port, victim_dev, creds.password) == NOT_AUTHORIZED
            # Sentinel: the intruder's own hello is answered, so its earlier publishes were seen
            # by the broker first (one publisher's messages stay in order).
            await intruder.open_audio_channel()
            assert gw.metric("xiaozhi_hellos_total") == hellos_before + 1
            assert gw.channel.session_id(victim_dev) == hello.session_id
            # It cannot read the victim's downlink, where session keys travel: a subscription
            # is accepted but nothing is delivered. The gateway answers the victim's hello and
            # then the intruder's (one publisher: in order), so the spy would see both.
            intruder_dev = dev_of(intruder)
            async with mqtt_client(broker, creds) as spy:
                await spy.subscribe(f"devices/p2p/{victim_dev}", qos=0)
                await spy.subscribe(f"devices/p2p/{intruder_dev}", qos=0)
                await victim.open_audio_channel()
                await intruder.open_audio_channel()
                await spy.expect(f"devices/p2p/{intruder_dev}")
                assert f"devices/p2p/{victim_dev}" not in spy.topics_seen()


async def test_malformed_control_flood_is_counted_and_harmless(broker: Broker) -> None:
    timeline = speech.compose([400, "Still working fine.", 900])
    async with running_gateway(broker) as gw:
        victim, flooder = await connected_sim(gw), await connected_sim(gw)
        async with victim, flooder:
            await victim.open_audio_channel()
            await victim.listen_start()
            bodies = malformed_bodies(980, session_id="nope")
            for body in bodies:
                await flooder.publish(body)
            too_big = 20  # 100 KiB: over the broker's 64 KiB packet limit → sender disconnected
            for _ in range(too_big):
                assert await broker_cuts_off(broker, flooder, b"{" + b" " * 100 * 1024 + b"}")
            await flooder.open_audio_channel()  # sentinel: every earlier publish was handled
            dropped = sum(
                gw.metric("xiaozhi_control_dropped_total", reason=r)
                for r in (
                    "malformed_json",
                    "too_deep",
                    "not_object",
                    "missing_type",
                    "unknown_type",
                    "unsupported_version",
                    "unsupported_transport",
                    "invalid",
                    "no_session",
                    "stale_goodbye",
                )
            )
            oversize = gw.metric("mqtt_messages_in_dropped_total", reason="oversize")
            assert dropped + oversize == len(bodies)
            assert oversize == sum(len(b) > 8192 for b in bodies)
            await victim.stream_pcm(timeline.pcm, speed=10)
            await gw.recorder.wait_for(lambda: len(gw.recorder.utterances_of(dev_of(victim))) >= 1)
            assert_boundaries(gw, dev_of(victim), timeline)
            assert gw.channel.session_id(dev_of(victim)) is not None


def malformed_bodies(count: int, *, session_id: str) -> list[bytes]:
    shapes: list[bytes] = [
        b"{not json",
        b"\xff\xfe\x00",
        b"",
        b"null",
        b"[1,2,3]",
        b'"hello"',
        b'{"type":null}',
        b'{"no":"type"}',
        b'{"type":"explode"}',
        b'{"type":"hello","version":"3","transport":"udp"}',
        b'{"type":"hello","version":3,"transport":"tcp"}',
        b'{"type":"hello","version":3,"transport":"udp","audio_params":[]}',
        b'{"type":"listen","state":42}',
        b'{"type":"listen","state":"start","mode":"turbo"}',
        b'{"type":"abort","session_id":7}',
        b'{"type":"mcp"}',
        b'{"type":"mcp","payload":"not an object"}',
        json.dumps({"session_id": session_id, "type": "listen", "state": "start"}).encode(),
        json.dumps({"session_id": session_id, "type": "goodbye"}).encode(),
        b"[" * 3000 + b"]" * 3000,
        b'{"type":"listen","pad":"' + b"x" * 60_000 + b'"}',
    ]
    return [shapes[i % len(shapes)] for i in range(count)]


async def broker_cuts_off(broker: Broker, sim: XiaozhiDeviceSim, payload: bytes) -> bool:
    """Publish ``payload`` on a throwaway connection as ``sim``; True if the broker drops it."""
    info = sim.mqtt_info
    assert info is not None
    client = aiomqtt.Client(
        broker.host,
        broker.port,
        username=info.username,
        password=info.password,
        identifier=f"{info.client_id}-big-{secrets.token_hex(3)}",
        protocol=aiomqtt.ProtocolVersion.V311,
        timeout=5,
    )
    cut = False
    with contextlib.suppress(aiomqtt.MqttError):
        async with client:
            await client.publish(info.publish_topic, payload, qos=0)
            try:
                async with asyncio.timeout(5):
                    async for _ in client.messages:
                        pass
            except aiomqtt.MqttError:
                cut = True
    return cut


async def test_one_devices_udp_flood_does_not_starve_another(broker: Broker) -> None:
    """A device floods the shared UDP socket as fast as the gateway reads it, for as long as
    another device speaks: the speaker's words come out of the VAD exactly.

    The flood goes in bursts of ``FLOOD_BURST``, each sent once the gateway has read the ones
    before. Faster than that, the kernel itself drops datagrams from the full socket buffer, the
    speaker's among them, whatever the gateway does: on two loaded cores a flood from a thread
    outran the gateway's loop and cost the speaker frames (an utterance split in two, or its
    start lost). What this test holds the gateway to is its own share: a flooder's datagrams
    cost a token-bucket check each and no turn of another session's audio. That the kernel
    dropped nothing is measured (``/proc/net/udp``), not assumed."""
    timeline = speech.compose([400, "I am still heard.", 900, "Every single word.", 900])
    async with running_gateway(broker, udp_rate_pps=40.0) as gw:  # the production budget
        flooder, speaker = await connected_sim(gw), await connected_sim(gw)
        async with flooder, speaker:
            await flooder.open_audio_channel()
            await speaker.open_audio_channel()
            await flooder.listen_start()
            await speaker.listen_start()
            noise = encode_pcm(secrets.token_bytes(2 * 16000))  # 1 s of loud noise, 17 packets
            assert flooder.crypto is not None
            assert flooder.hello is not None
            crypto, target = flooder.crypto, (flooder.hello.server, flooder.hello.port)
            watch = DatagramWatch(gw.channel)
            flooded = 0
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flooder_sock:
                # The first datagram binds the flooder's session to this socket.
                flooder_sock.setblocking(False)
                speaking = asyncio.create_task(
                    speaker.stream_pcm(timeline.pcm, speed=2), name="test.speak"
                )
                while not speaking.done():
                    for _ in range(FLOOD_BURST):
                        flooder_sock.sendto(crypto.seal(noise[flooded % len(noise)]), target)
                        flooded += 1
                    # The speaker's datagrams count too: a few of the flood's may still wait.
                    await watch.until(
                        lambda read=flooded: gw.metric("xiaozhi_udp_packets_in_total") >= read
                    )
                await speaking
            await gw.recorder.wait_for(
                lambda: len(gw.recorder.utterances_of(dev_of(speaker))) >= len(timeline.utterances)
            )
            assert kernel_drops(gw.channel.udp_port) == 0
            assert_boundaries(gw, dev_of(speaker), timeline)
        # The flood cost a token-bucket check per excess datagram, not decryption and decoding
        # (the flooder's budget is 80 + 40/s, a few hundred frames over the speech). Once the
        # flooder's sequence numbers run 1,000 past the last one its budget let through (a
        # gateway that reads fast enough sees that many), the sequence check refuses them
        # first (seq_jump): also before any crypto.
        assert flooded >= 2000
        refused = sum(
            gw.metric("xiaozhi_udp_dropped_total", reason=reason)
            for reason in ("rate_limited", "seq_jump")
        )
        assert refused >= flooded - 400
        assert gw.metric("xiaozhi_opus_frames_decoded_total") < 1000


def kernel_drops(port: int) -> int:
    """Datagrams the kernel dropped on the UDP socket bound to ``port`` (``/proc/net/udp``)."""
    lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    for line in lines:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            return int(fields[-1])
    raise AssertionError(f"no UDP socket on port {port}")
