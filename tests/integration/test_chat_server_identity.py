"""CHAT as a xiaozhi server sees it (issue #31): the real gateway between a firmware-like device
(MQTT + AES UDP, real Opus) and the peer that follows xiaozhi-esp32-server v0.9.6's connection
handling and auth (tests/support/xiaozhi_server.py).

* the device's hello reply waits for the server's hello and carries its audio parameters; a
  server announcing 24 kHz is decoded by the device at 24 kHz, frames paced by their duration;
* no server hello within the bound: the device gets no reply, the reason is counted;
* the v0.9.6 HMAC token over the device's UUID and MAC is accepted; a wrong per-device secret is
  refused by the server (认证失败), counted ``auth_refused`` and alarmed; a device without an
  OTA binding (no UUID) is refused locally, counted ``no_client_id``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import opuslib

from gateway.chat.credentials import secrets_path
from gateway.chat.cues import build_cues
from gateway.chat.voice import CueKind
from tests.support.broker import Broker
from tests.support.chat_rig import ChatRig, chat_rig
from tests.support.xiaozhi_server import ServerAuth

RATE_24K = 24_000
FRAME_24K = RATE_24K * 60 // 1000  # 1440 samples in a 60 ms frame


def tone_24k(seconds: float, hz: float = 440.0) -> list[bytes]:
    """A 24 kHz tone as 60 ms Opus frames (what a server with 24 kHz TTS sends)."""
    samples = int(seconds * RATE_24K) // FRAME_24K * FRAME_24K
    pcm = b"".join(
        struct.pack("<h", int(12000 * math.sin(2 * math.pi * hz * i / RATE_24K)))
        for i in range(samples)
    )
    encoder = opuslib.Encoder(RATE_24K, 1, opuslib.APPLICATION_AUDIO)
    step = FRAME_24K * 2
    return [encoder.encode(pcm[i : i + step], FRAME_24K) for i in range(0, len(pcm), step)]


def crossings_hz(pcm: bytes, rate: int) -> float:
    values = [v for (v,) in struct.iter_unpack("<h", pcm)]
    flips = sum(1 for a, b in itertools.pairwise(values) if (a < 0) != (b < 0))
    return flips / 2 / (len(values) / rate)


def write_secrets(rig: ChatRig, doc: dict[str, Any]) -> None:
    path = secrets_path(rig.lesson.settings.data_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(doc))


async def test_hello_waits_for_the_server_and_24k_tts_decodes_at_24k(
    broker: Broker, tmp_path: Path
) -> None:
    announced = {"format": "opus", "sample_rate": RATE_24K, "channels": 1, "frame_duration": 60}
    options = {"echo_client_audio": False, "audio": announced}
    async with chat_rig(broker, tmp_path, peer_options=options) as rig:
        peer = rig.upstream
        peer.answer_hellos.clear()  # the server is slow to say hello
        seen = len(rig.device.inbox)
        opening = asyncio.create_task(rig.device.open_audio_channel())
        await peer.wait_for(lambda: bool(peer.sessions and peer.sessions[0].hello), "hello up")
        await asyncio.sleep(0.3)
        assert not any(m["type"] == "hello" for m in rig.device.inbox[seen:])  # held
        peer.answer_hellos.set()
        hello = await opening
        assert (hello.sample_rate, hello.frame_duration) == (RATE_24K, 60)  # the server's
        assert rig.lesson.metric('chat_hellos_answered_total{sample_rate="24000"}') == 1

        session = await peer.session(0)
        await rig.device.listen_start("auto")
        await rig.device.stream_opus(tone_24k(0.3), speed=4.0)  # its address, for the downlink
        await session.send_json(type="stt", text="play a tone")
        reply = tone_24k(1.5)
        await session.speak(reply, text="beep")
        await rig.device.expect("tts", state="stop")
        cues = build_cues()  # 16 kHz Opus: a 24 kHz decoder plays them as they are
        expected = [*cues[CueKind.SEGMENT_END], *reply, *cues[CueKind.START]]
        await rig.device.wait_audio(len(expected), timeout_s=30.0)
        assert rig.device.downlink_audio == expected
        decoder = opuslib.Decoder(hello.sample_rate, 1)  # what the firmware configures
        samples = hello.sample_rate * hello.frame_duration // 1000
        pcm = [decoder.decode(p, samples) for p in expected]
        assert {len(frame) for frame in pcm} == {FRAME_24K * 2}
        tts = pcm[len(cues[CueKind.SEGMENT_END]) :][: len(reply)]
        assert abs(crossings_hz(b"".join(tts[3:]), RATE_24K) - 440.0) < 15.0
        start = b"".join(pcm[-len(cues[CueKind.START]) :])  # 880 Hz, 120 ms
        assert abs(crossings_hz(start, RATE_24K) - 880.0) < 60.0


async def test_no_server_hello_no_reply_and_a_counted_reason(
    broker: Broker, tmp_path: Path
) -> None:
    async with chat_rig(broker, tmp_path, connect_timeout_s=1.0) as rig:
        rig.upstream.answer_hellos.clear()
        seen = len(rig.device.inbox)
        await rig.device.publish(b'{"type":"hello","version":3,"transport":"udp",'
                                 b'"features":{"mcp":true},"audio_params":{"format":"opus",'
                                 b'"sample_rate":16000,"channels":1,"frame_duration":60}}')  # fmt: skip
        bye = await rig.device.expect("goodbye", after=seen)
        assert bye["session_id"]  # the session the device was never told: it ignores it
        assert not any(m["type"] == "hello" for m in rig.device.inbox[seen:])
        assert rig.lesson.metric('chat_upstream_ends_total{reason="hello_timeout"}') == 1
        alarm = await rig.lesson.wait_alarm("chat_upstream_lost")
        assert alarm.body["detail"]["reason"] == "hello_timeout"
        rig.upstream.answer_hellos.set()


async def test_v096_hmac_token_accepted_wrong_secret_refused_and_counted(
    broker: Broker, tmp_path: Path
) -> None:
    auth = ServerAuth(auth_key="the-servers-auth-key")
    async with chat_rig(broker, tmp_path, peer_options={"auth": auth}) as rig:
        write_secrets(rig, {"default": {"scheme": "hmac", "key": "the-servers-auth-key"}})
        hello = await rig.device.open_audio_channel()
        session = await rig.upstream.session(0)
        assert session.headers["client-id"] == rig.uuid
        assert session.headers["device-id"] == rig.device.mac
        assert session.headers["authorization"].startswith("Bearer ")
        assert hello.session_id

        # this device's own secret is wrong: the server refuses it, clearly and countably
        write_secrets(
            rig,
            {
                "default": {"scheme": "hmac", "key": "the-servers-auth-key"},
                "devices": {rig.dev: {"scheme": "hmac", "key": "not-the-key"}},
            },
        )
        seen = len(rig.device.inbox)
        await rig.device.publish(b'{"type":"hello","version":3,"transport":"udp",'
                                 b'"features":{"mcp":true},"audio_params":{"format":"opus",'
                                 b'"sample_rate":16000,"channels":1,"frame_duration":60}}')  # fmt: skip
        await rig.device.expect("goodbye", after=seen)
        assert rig.upstream.auth_refused == 1
        assert rig.lesson.metric('chat_upstream_ends_total{reason="auth_refused"}') == 1
        alarm = await rig.lesson.wait_alarm("chat_upstream_lost")
        assert alarm.body["detail"]["reason"] == "auth_refused"
        assert "not-the-key" not in json.dumps(alarm.body)


async def test_unbound_device_has_no_uuid_for_hmac(broker: Broker, tmp_path: Path) -> None:
    auth = ServerAuth(auth_key="k" * 16)
    async with chat_rig(broker, tmp_path, peer_options={"auth": auth}, bound=False) as rig:
        write_secrets(rig, {"default": {"scheme": "hmac", "key": "k" * 16}})
        seen = len(rig.device.inbox)
        await rig.device.publish(b'{"type":"hello","version":3,"transport":"udp",'
                                 b'"features":{"mcp":true},"audio_params":{"format":"opus",'
                                 b'"sample_rate":16000,"channels":1,"frame_duration":60}}')  # fmt: skip
        await rig.device.expect("goodbye", after=seen)
        assert rig.lesson.metric('chat_upstream_ends_total{reason="no_client_id"}') == 1
        assert rig.upstream.sessions == []
