"""Voice-session v1 in CHAT on real UDP/Opus (the firmware-like simulator): the timeout tone
before a silence standby, the failure cue at once on an engine error (latency measured), and
the firmware's wake-word audio (sent before its ``listen detect``) relayed upstream, counted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.chat.cues import build_cues, cue_ms
from gateway.chat.embedded import EmbeddedEngine, EngineError
from gateway.chat.voice import CueKind
from gateway.simulators.xiaozhi import encode_pcm
from tests.integration.test_chat_embedded import greeted
from tests.support.broker import Broker
from tests.support.chat_rig import chat_rig
from tests.support.speech import silence, synthesize

CUES = build_cues()
# Engine error → the failure cue's first frame read by the device: a hang guard far below the
# 20 s reply timeout this path must not wait for (the rig holds audio chat.tts_lead_s after
# ``tts start``; the rest is loop turns and two sockets on a busy CI).
FAILURE_CUE_BOUND_S = 5.0


async def test_silence_plays_the_timeout_tone_then_standby(broker: Broker, tmp_path: Path) -> None:
    async with chat_rig(broker, tmp_path, upstream=False, silence_timeout_s=1.0) as rig:
        after = await greeted(rig)
        bye = await rig.device.expect("goodbye", timeout_s=10, after=after)
        assert rig.device.hello is not None
        assert bye["session_id"] == rig.device.hello.session_id
        # the tone's own bracket came first, whole, and the goodbye waited for it to play
        assert [m["type"] + ":" + m.get("state", "") for m in rig.device.inbox[after:]] == [
            "tts:start",
            "tts:stop",
            "goodbye:",
        ]
        assert rig.device.downlink_audio == list(CUES[CueKind.TIMEOUT])
        assert rig.lesson.metric('chat_standby_total{reason="silence"}') == 1
        assert rig.lesson.metric('chat_cues_total{kind="timeout"}') == 1


async def test_engine_error_plays_the_failure_cue_at_once(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed_at: list[float] = []

    async def failing(self: EmbeddedEngine, dev: str, turn: int, pcm: bytes) -> None:
        await asyncio.sleep(0.3)  # the recogniser works a while (the segment-end cue plays)
        failed_at.append(time.monotonic())
        raise EngineError("asr_timeout")

    monkeypatch.setattr(EmbeddedEngine, "answer", failing)
    async with chat_rig(broker, tmp_path, upstream=False) as rig:
        after = await greeted(rig)
        await rig.device.stream_opus(encode_pcm(silence(300) + synthesize("hello") + silence(900)))
        bye = await rig.device.expect("goodbye", timeout_s=10, after=after)
        assert rig.device.hello is not None
        assert bye["session_id"] == rig.device.hello.session_id
        seg, failure = list(CUES[CueKind.SEGMENT_END]), list(CUES[CueKind.FAILURE])
        assert rig.device.downlink_audio == seg + failure
        (at,) = failed_at
        latency_s = rig.device.downlink_at[len(seg)] - at
        print(f"engine error → failure cue at the device: {latency_s * 1000:.1f} ms")
        assert 0 < latency_s < FAILURE_CUE_BOUND_S  # not the 20 s reply timeout
        assert rig.lesson.metric('chat_standby_total{reason="asr_timeout"}') == 1
        assert rig.lesson.metric('chat_cues_total{kind="failure"}') == 1
        assert cue_ms(CUES[CueKind.FAILURE]) == 360


async def test_wake_word_audio_is_relayed_before_listen_detect(
    broker: Broker, tmp_path: Path
) -> None:
    async with chat_rig(broker, tmp_path, upstream=True) as rig:
        await rig.device.open_audio_channel()
        peer = await rig.upstream.session(0)
        # CONFIG_SEND_WAKE_WORD_DATA: the buffered wake word's packets, then listen detect
        # with the wake word's text, then listen start (application.cc).
        wake = encode_pcm(synthesize("hello there, speaker") + silence(3000))[:45]
        assert len(wake) == 45
        await rig.device.stream_opus(wake, speed=4.0)
        await rig.device.send_json(type="listen", state="detect", text="你好小智")
        await rig.device.listen_start("auto")
        await rig.upstream.wait_for(lambda: bool(peer.named("listen", state="start")), "listen")
        (detect,) = peer.named("listen", state="detect")
        assert detect["text"] == "你好小智"
        assert peer.audio == wake[:40]  # as the firmware sent it, up to 2.4 s of it
        assert rig.lesson.metric('chat_uplink_outside_turn_total{reason="wake_word"}') == 40
        assert rig.lesson.metric('chat_uplink_outside_turn_total{reason="before_listen"}') == 5
