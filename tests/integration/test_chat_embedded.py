"""CHAT offline (no ``chat.upstream_url``): the embedded engine answers a spoken turn end to end
— device speech over encrypted UDP → the gateway's VAD ends the segment → pocketsphinx in the
assessment pool's worker → a rule reply → espeak-ng → Opus → paced down to the device."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import opuslib
import pytest

from gateway.chat.cues import build_cues
from gateway.chat.replies import GREETING_EN, PHRASES, reply_to
from gateway.chat.voice import CueKind
from gateway.simulators.xiaozhi import FRAME_SAMPLES, RATE, SIM_TOOLS, encode_pcm
from gateway.xiaozhi.mcp import GATEWAY_IDS
from tests.support.broker import Broker
from tests.support.chat_rig import ChatRig, chat_rig
from tests.support.speech import silence, synthesize

CUES = build_cues()


async def greeted(rig: ChatRig, mode: str = "auto") -> int:
    """Hello, listen, a first datagram (the gateway learns where the device is), then the
    greeting (voice-session v1 §1.2) ending with the start cue; returns the inbox position
    after the greeting's ``tts stop`` and checks the greeting's audio."""
    await rig.device.open_audio_channel()
    await rig.device.listen_start(mode)
    await rig.device.stream_opus(encode_pcm(silence(120)))
    sentence = await rig.device.expect("tts", state="sentence_start", timeout_s=30)
    assert sentence["text"] == GREETING_EN
    await rig.device.expect("tts", state="stop", timeout_s=30)
    start = CUES[CueKind.START]
    await rig.device.wait_audio(len(start) + 5)
    assert rig.device.downlink_audio[-len(start) :] == list(start)  # then listening begins
    assert rig.chat_state() == "prompt_listen"
    rig.device.downlink_audio.clear()
    rig.device.downlink_at.clear()
    return len(rig.device.inbox)


@pytest.mark.parametrize("keep_turns", [False, True], ids=["chat-not-archived", "chat-archived"])
async def test_spoken_turn_answered_offline(
    broker: Broker, tmp_path: Path, keep_turns: bool
) -> None:
    """…and the child's turn is archived only when ``archive.chat_turns`` says so."""
    sections = {
        "asr": {"engine": "pocketsphinx", "workers": 1},
        "archive": {"chat_turns": keep_turns},
    }
    async with chat_rig(broker, tmp_path, upstream=False, sections=sections) as rig:
        after = await greeted(rig)
        assert rig.device.hello is not None
        hello = rig.device.hello
        await rig.device.stream_opus(encode_pcm(silence(300) + synthesize("hello") + silence(900)))

        start = await rig.device.expect("tts", state="start", timeout_s=60, after=after)
        sentence = await rig.device.expect("tts", state="sentence_start", after=after)
        await rig.device.expect("tts", state="stop", timeout_s=30, after=after)
        assert start["session_id"] == hello.session_id
        # the device saw what was heard (stt) and the rule reply to it (no verdict, no score)
        (stt,) = [m for m in rig.device.inbox if m["type"] == "stt"]
        assert stt["text"] in PHRASES  # recognised against the rules' phrases
        assert sentence["text"] == reply_to(stt["text"], datetime.now()).text

        # the segment-end cue first, the reply, then the start cue: listening again
        seg, cue = list(CUES[CueKind.SEGMENT_END]), list(CUES[CueKind.START])
        await rig.device.wait_audio(len(seg) + 5 + len(cue))
        assert rig.device.downlink_audio[: len(seg)] == seg
        assert rig.device.downlink_audio[-len(cue) :] == cue
        # the reply is real speech the device can decode: 60 ms frames, not silence
        audio = rig.device.downlink_audio
        assert len(audio) >= 5
        decoder = opuslib.Decoder(RATE, 1)
        pcm = b"".join(decoder.decode(frame, FRAME_SAMPLES) for frame in audio)
        assert len(pcm) == len(audio) * FRAME_SAMPLES * 2
        assert max(abs(int.from_bytes(pcm[i : i + 2], "little", signed=True))
                   for i in range(0, len(pcm), 2)) > 1000  # fmt: skip
        assert rig.chat_state() == "prompt_listen"  # auto mode: the next turn is open

        archive = rig.lesson.gw.archive
        assert archive is not None
        await archive.drained()
        kept = await rig.lesson.gw.store.audio_of_device(rig.dev)
        if not keep_turns:
            assert kept == []
            return
        (turn,) = kept
        assert turn.instance_id == f"chat-{hello.session_id}"
        packets = await archive.packets(turn.audio_id)
        assert 5 <= len(packets) <= 60  # "hello" (~0.5 s) as the VAD cut it, 60 ms packets
        assert turn.duration_ms == 60 * len(packets)


async def test_spoken_start_begins_a_voice_task_and_priorities_hold(
    broker: Broker, tmp_path: Path
) -> None:
    sections = {"asr": {"engine": "pocketsphinx", "workers": 1}}
    async with chat_rig(broker, tmp_path, upstream=False, sections=sections) as rig:
        after = await greeted(rig)
        said = silence(300) + synthesize("start the lesson") + silence(900)
        await rig.device.stream_opus(encode_pcm(said))
        sentence = await rig.device.expect("tts", state="sentence_start", timeout_s=60, after=after)
        assert sentence["text"] == "Okay, let us start the lesson."

        started = await rig.lesson.wait_event("instance.started", wait_s=30)
        runtime = rig.lesson.runtime()
        assert runtime is not None
        assert runtime.instance is not None
        assert runtime.instance.record.priority == 1  # a voice-started task
        assert runtime.instance.record.source == "voice"
        assert rig.chat_state() == "suspended"

        # priorities hold: a scheduled start (2) preempts the voice task
        reply = await rig.lesson.start(priority=2)
        assert reply["status"] == "accepted"
        voice_id = started.body["instance_id"]
        cancelled = await rig.lesson.wait_event("instance.cancelled", instance_id=voice_id)
        assert cancelled.data["reason"] == "preempted"
        assert rig.chat_state() == "suspended"  # still a task on the device


async def test_with_no_server_the_gateway_asks_the_device_for_its_tools_at_connect(
    broker: Broker, tmp_path: Path
) -> None:
    """No upstream server asks (embedded engine): the gateway sends ``tools/list`` itself once
    the device's hello is answered, and the answer is kept with the device's status."""
    async with chat_rig(broker, tmp_path, upstream=False) as rig:
        await rig.device.open_audio_channel()
        asked = await rig.device.expect("mcp", timeout_s=10)
        assert asked["payload"]["method"] == "tools/list"
        assert asked["payload"]["id"] >= GATEWAY_IDS  # the gateway's own id space
        path = f"/admin/devices/{rig.dev}/status"

        async def tools() -> list[dict[str, object]]:
            status, body = await rig.lesson.http_get(path)
            return body["mcp"]["tools"] if status == 200 else []

        async with asyncio.timeout(10):
            while not await tools():  # noqa: ASYNC110 - an HTTP route to read, no event; bounded
                await asyncio.sleep(0.05)
        assert [t["name"] for t in await tools()] == [SIM_TOOLS[0]["name"]]
