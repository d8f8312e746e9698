"""A shadowing lesson on a device without an SD card (client-architecture plan §8.2): no snlp/v1
board at all, only the Xiaozhi device simulator on a real Mosquitto and real encrypted UDP. The
gateway streams each lesson clip (a real MP3, espeak-ng → sox) as Opus that real libopus
decodes to the clip's duration; each listen window follows its clip and is sized from that
duration; the child's spoken answers are assessed (pocketsphinx in a worker process). A stop
mid-clip cancels the clip (the device gets ``tts stop``)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import opuslib

from gateway.assessment.sphinx import PocketsphinxEngine
from tests.support.broker import Broker
from tests.support.sdless_lesson import (
    clip_frame_counts,
    make_resources,
    sdless_rig,
    sox_pcm,
    stop_request,
)
from tests.support.verdicts import verdict_keys
from tests.support.voice_lesson import RATIO, child, fetch_instance, start

RATE = 16_000
FRAME_MS = 60
FRAME_SAMPLES = RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2
CLIPS = {
    "01.mp3": "Good morning.",
    "02.mp3": "How are you?",
    "03.mp3": "I am fine, thank you.",
    "04.mp3": "See you later.",
}
SCRIPT: dict[int, str | None] = {
    0: "Good morning.",  # right
    1: "I like green apples.",  # wrong
    2: None,  # silent
    3: "See you later, alligator.",
}
LONG = "One two three four five six seven eight nine ten, and then we count back again slowly."


def decode(frames: list[bytes]) -> bytes:
    decoder = opuslib.Decoder(RATE, 1)
    return b"".join(decoder.decode(frame, FRAME_SAMPLES) for frame in frames)


def peak(pcm: bytes) -> int:
    return max(abs(s) for s in memoryview(pcm).cast("h"))


def expected_frames(path: Path) -> int:
    return math.ceil(len(sox_pcm(path)) / FRAME_BYTES)


def _similarity(assessment: dict[str, Any]) -> float:
    (metric,) = assessment["metrics"]
    return float(metric["value"])


async def test_a_shadowing_lesson_runs_on_a_device_without_an_sd_card(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    resources = await asyncio.to_thread(make_resources, tmp_path / "resources", CLIPS)
    lesson = resources / "english_learning/shadowing/lessons/unit01"
    frames = [await asyncio.to_thread(expected_frames, lesson / name) for name in CLIPS]
    async with sdless_rig(broker, tmp_path, device_id, PocketsphinxEngine, resources) as (
        gw,
        seen,
        device,
        backend,
    ):
        assert gw.board.status_of(device_id) is None  # no board, ever
        async with asyncio.TaskGroup() as tg:
            counts = tg.create_task(clip_frame_counts(device, len(CLIPS)), name="test.clips")
            reader = tg.create_task(child(device, seen, SCRIPT), name="test.child")
            instance_id = await start(backend, device_id, seen)
            await seen.until(lambda: bool(seen.named("instance.completed")), 90)
            await reader
            at_stops = await counts

        # Each clip arrived whole as Opus that libopus decodes to the clip's own duration.
        per_clip = [b - a for a, b in zip([0, *at_stops], at_stops, strict=False)]
        assert per_clip == frames
        starts = [m for m in device.inbox if m["type"] == "tts" and m["state"] == "start"]
        assert len(starts) == len(CLIPS)
        audio = device.downlink_audio
        for index, count in enumerate(frames):
            first = sum(frames[:index])
            decoded = decode(audio[first : first + count])
            assert len(decoded) == count * FRAME_BYTES
            assert peak(decoded) > 1000  # speech, not silence

        # The lesson stepped on the clips' completions: each window follows its clip and is
        # sized from the clip's real duration.
        played, opened = seen.named("step.played"), seen.named("window.opened")
        closed = seen.named("window.closed")
        assert [e["step_index"] for e in played] == [0, 1, 2, 3]
        assert [e["step_index"] for e in opened] == [0, 1, 2, 3]
        for clip_frames, window, play in zip(frames, opened, played, strict=True):
            assert window["ts"] >= play["ts"]
            assert window["data"]["window_ms"] == round(clip_frames * FRAME_MS * RATIO)
        for window, nxt in zip(closed, played[1:], strict=False):
            assert nxt["ts"] >= window["data"]["planned_close_ms"]

        # The answers were heard and assessed.
        await seen.until(lambda: len(seen.assessments) >= 3, 60)
        by_step = {a["step_index"]: a for a in seen.assessments}
        assert set(by_step) == {0, 1, 3}
        assert _similarity(by_step[0]) >= 0.8
        assert _similarity(by_step[1]) <= 0.5
        assert all(a["instance_id"] == instance_id for a in seen.assessments)

        await gw.store.flush()
        stored = await fetch_instance(gw, instance_id)
        assert stored["instance"]["state"] == "completed"
        steps = {s["step_index"]: s for s in stored["steps"]}
        assert [steps[i]["duration_ms"] for i in range(4)] == [n * FRAME_MS for n in frames]
        assert not verdict_keys([seen.events, seen.assessments, stored])
        registry = gw.service.metrics.registry
        clips_done = registry.get_sample_value("snlpgw_speech_completed_total", {"kind": "clip"})
        assert clips_done == len(CLIPS)


async def test_a_stop_mid_clip_cancels_the_clip(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    resources = await asyncio.to_thread(
        make_resources, tmp_path / "resources", {**dict.fromkeys(CLIPS, "Hello."), "01.mp3": LONG}
    )
    full = await asyncio.to_thread(
        expected_frames, resources / "english_learning/shadowing/lessons/unit01/01.mp3"
    )
    async with sdless_rig(broker, tmp_path, device_id, PocketsphinxEngine, resources) as (
        gw,
        seen,
        device,
        backend,
    ):
        # No board channel at all: its open voice session is what the console reads as online.
        assert gw.xiaozhi.session_id(device_id) is not None
        assert gw.xiaozhi.session_id("no-such-device") is None
        await start(backend, device_id, seen)
        started = await device.expect("tts", state="start", timeout_s=30)
        after = device.inbox.index(started) + 1
        await device.wait_audio(3, timeout_s=30)  # the clip is playing
        await backend.publish(f"snlpgw/v1/ctl/{device_id}", json.dumps(stop_request()))
        await seen.until(lambda: bool(seen.named("instance.cancelled")), 30)
        await device.expect("tts", state="stop", after=after, timeout_s=30)
        registry = gw.service.metrics.registry
        cancelled = {"reason": "cancelled"}
        assert registry.get_sample_value("snlpgw_speech_interrupted_total", cancelled) == 1
        assert registry.get_sample_value("snlpgw_speech_completed_total", {"kind": "clip"}) is None
        assert len(device.downlink_audio) < full
        assert not seen.named("window.opened")  # the clip never completed


async def test_a_repeater_plays_its_clip_n_times_on_a_device_without_an_sd_card(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    """The repeater's ``repeat: 3``: one stream of three plays; the step's duration is all 3."""
    resources = await asyncio.to_thread(
        make_resources, tmp_path / "resources", {"01.mp3": "Good morning."}
    )
    once = await asyncio.to_thread(
        expected_frames, resources / "english_learning/shadowing/lessons/unit01/01.mp3"
    )
    # the repeater's clips live under its own task
    repeater = resources / "english_learning/repeater/lessons/unit01"
    repeater.mkdir(parents=True)
    (resources / "english_learning/shadowing/lessons/unit01/01.mp3").rename(repeater / "01.mp3")
    async with sdless_rig(broker, tmp_path, device_id, PocketsphinxEngine, resources) as (
        gw,
        seen,
        device,
        backend,
    ):
        instance_id = await start(backend, device_id, seen, task_id="repeater", params={})
        await seen.until(lambda: bool(seen.named("instance.completed")), 60)
        await device.expect("tts", state="stop", timeout_s=30)
        starts = [m for m in device.inbox if m["type"] == "tts" and m["state"] == "start"]
        assert len(starts) == 1
        assert len(device.downlink_audio) == 3 * once
        decoded = decode(device.downlink_audio)
        assert len(decoded) == 3 * once * FRAME_BYTES
        await gw.store.flush()
        stored = await fetch_instance(gw, instance_id)
        assert stored["instance"]["state"] == "completed"
        assert [s["duration_ms"] for s in stored["steps"]] == [3 * once * FRAME_MS]
