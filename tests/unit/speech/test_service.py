"""The SPEAK shell with a fake channel and a fake engine (real loop, real libopus): the paths
the integration tests cannot reach on purpose — another output rate, a cancel during synthesis,
a session that goes away or changes, refusals, a failing sink, the service stopping."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import opuslib

from gateway.metrics import Metrics
from gateway.settings import SpeechSettings
from gateway.speech.engines import SynthesisError
from gateway.speech.service import SpeechService
from gateway.speech.target import DownlinkTarget


class FakeDownlink:
    def __init__(self) -> None:
        self.targets: dict[str, DownlinkTarget] = {}
        self.reach = True
        self.published: list[tuple[str, dict[str, Any]]] = []
        self.audio: list[bytes] = []
        self.changed = asyncio.Event()

    def downlink_target(self, dev: str) -> DownlinkTarget | None:
        return self.targets.get(dev)

    async def reachable(self, dev: str, session_id: str, timeout_s: float) -> bool:
        return self.reach

    def publish(self, dev: str, payload: bytes) -> None:
        self.published.append((dev, json.loads(payload)))
        self.changed.set()

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool:
        target = self.targets.get(dev)
        if target is None or target.session_id != session_id:
            return False
        self.audio.append(opus_packet)
        self.changed.set()
        return True

    def states(self) -> list[str]:
        return [m["state"] for _, m in self.published]


class ToneTts:
    """A fake engine: ``ms`` of a 440 Hz tone; ``gate`` (when set) holds synthesis."""

    name = "tone"

    def __init__(self, ms: int = 600) -> None:
        self.ms = ms
        self.gate: asyncio.Event | None = None
        self.calls = 0
        self.called = asyncio.Event()

    def voices(self) -> frozenset[str]:
        return frozenset({"en", "zh"})

    async def pcm(self, http: aiohttp.ClientSession, text: str, voice: str, rate: int) -> bytes:
        self.calls += 1
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        n = rate * self.ms // 1000
        samples = (int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(n))
        return b"".join(s.to_bytes(2, "little", signed=True) for s in samples)


class Sink:
    def __init__(self, *, fail_first: bool = False) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.fail_first = fail_first
        self.changed = asyncio.Event()

    def speak_started(self, dev: str, speak_id: str) -> None:
        self._add(("started", dev, speak_id))

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        self._add(("completed", dev, speak_id, duration_ms))

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        self._add(("interrupted", dev, speak_id, reason))

    def _add(self, event: tuple[Any, ...]) -> None:
        self.events.append(event)
        self.changed.set()
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("sink failed")

    async def end_of(self, speak_id: str) -> tuple[Any, ...]:
        async with asyncio.timeout(10):
            while True:
                for event in self.events:
                    if event[2] == speak_id and event[0] != "started":
                        return event
                self.changed.clear()
                await self.changed.wait()


async def until(event: asyncio.Event, condition: Any) -> None:
    async with asyncio.timeout(10):
        while not condition():
            event.clear()
            await event.wait()


@asynccontextmanager
async def running(
    channel: FakeDownlink, sink: Sink, engine: ToneTts, **settings: Any
) -> AsyncIterator[SpeechService]:
    service = SpeechService(
        settings=SpeechSettings(**{"tts_lead_s": 0.0, **settings}),
        channel=channel,
        sink=sink,
        metrics=Metrics(),
        engine=engine,
    )
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(service.run())
        await service.wait_ready()
        try:
            yield service
        finally:
            task.cancel()


async def test_speech_is_encoded_for_the_rate_the_session_announced() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts(ms=600)
    channel.targets["d"] = DownlinkTarget("s1", 24_000, 60)
    async with running(channel, sink, engine) as service:
        service.speak("d", speak_id="x", text="hi", voice="en")
        assert await sink.end_of("x") == ("completed", "d", "x", 600)
    assert channel.states() == ["start", "sentence_start", "stop"]
    assert len(channel.audio) == 10
    decoder = opuslib.Decoder(24_000, 1)
    assert all(len(decoder.decode(f, 1440)) == 2880 for f in channel.audio)


async def test_cancel_during_synthesis_sends_nothing() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts()
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    engine.gate = asyncio.Event()
    async with running(channel, sink, engine) as service:
        service.speak("d", speak_id="x", text="hi", voice="en")
        await until(engine.called, lambda: engine.calls == 1)
        service.cancel("d", "x")
        assert await sink.end_of("x") == ("interrupted", "d", "x", "cancelled")
        engine.gate.set()
        service.speak("d", speak_id="y", text="other", voice="en")  # the device goes on
        assert (await sink.end_of("y"))[0] == "completed"
    assert [e for e in sink.events if e[2] == "x"] == [("interrupted", "d", "x", "cancelled")]
    assert channel.states() == ["start", "sentence_start", "stop"]  # y's only


async def test_a_session_that_goes_away_mid_speech_interrupts_it() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts(ms=3000)
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    async with running(channel, sink, engine) as service:
        service.speak("d", speak_id="x", text="hi", voice="en")
        await until(channel.changed, lambda: len(channel.audio) >= 8)
        del channel.targets["d"]  # the device said goodbye
        assert await sink.end_of("x") == ("interrupted", "d", "x", "session_closed")
    assert "stop" not in channel.states()  # nothing goes to a closed session
    assert ("completed", "d", "x", 3000) not in sink.events


async def test_a_session_replaced_during_synthesis_interrupts() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts()
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    engine.gate = asyncio.Event()
    async with running(channel, sink, engine) as service:
        service.speak("d", speak_id="x", text="hi", voice="en")
        await until(engine.called, lambda: engine.calls == 1)
        channel.targets["d"] = DownlinkTarget("s2", 16_000, 60)  # a new hello meanwhile
        engine.gate.set()
        assert await sink.end_of("x") == ("interrupted", "d", "x", "session_closed")
        service.session_closed("d", "s2", "goodbye")  # nothing speaking: nothing happens
    assert channel.published == []


async def test_session_closed_from_the_channel_events_interrupts_at_once() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts(ms=3000)
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    async with running(channel, sink, engine) as service:
        service.speak("d", speak_id="x", text="hi", voice="en")
        await until(channel.changed, lambda: len(channel.audio) >= 3)
        service.session_closed("d", "s1", "goodbye")
        assert await sink.end_of("x") == ("interrupted", "d", "x", "session_closed")


async def test_refusals() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts()
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    channel.targets["e"] = DownlinkTarget("s9", 16_000, 60)
    early = SpeechService(
        settings=SpeechSettings(), channel=channel, sink=sink, metrics=Metrics(), engine=engine
    )
    early.speak("d", speak_id="early", text="hi", voice="en")
    assert await sink.end_of("early") == ("interrupted", "d", "early", "not_running")
    async with running(channel, sink, engine, max_devices=1, max_utterance_s=0.3) as service:
        service.speak("d", speak_id="long", text="hi", voice="en")  # 600 ms > 300 ms
        assert await sink.end_of("long") == ("interrupted", "d", "long", "too_long")
        service.speak("d", speak_id="book", text="x" * 2001, voice="en")
        assert await sink.end_of("book") == ("interrupted", "d", "book", "too_long")
        assert engine.calls == 1  # refused before synthesis
        engine.gate = asyncio.Event()
        service.speak("d", speak_id="held", text="held", voice="en")
        service.speak("e", speak_id="second", text="hi", voice="en")
        assert await sink.end_of("second") == ("interrupted", "e", "second", "busy")
        service.cancel("d", "held")
        engine.gate.set()
        channel.reach = False
        service.speak("d", speak_id="far", text="far", voice="en")
        assert await sink.end_of("far") == ("interrupted", "d", "far", "device_unreachable")


async def test_a_failing_sink_is_contained_and_stopping_interrupts() -> None:
    channel, sink, engine = FakeDownlink(), Sink(fail_first=True), ToneTts(ms=3000)
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    async with running(channel, sink, engine) as service:
        service.speak("d", speak_id="x", text="hi", voice="en")
        await until(sink.changed, lambda: ("started", "d", "x") in sink.events)  # it raised
        await until(channel.changed, lambda: len(channel.audio) >= 3)
    # the service stopped mid-speech: reported on the loop's next turn
    assert await sink.end_of("x") == ("interrupted", "d", "x", "service_stopped")


class SpeakPortShape(Protocol):
    """The task DSL's ``SpeakPort`` as agreed (gateway/tasks/ports.py on the dsl branch)."""

    def speak(self, dev: str, *, speak_id: str, text: str, voice: str) -> None: ...

    def cancel(self, dev: str, speak_id: str) -> None: ...


def test_the_service_is_the_task_runtimes_speak_port() -> None:
    service = SpeechService(
        settings=SpeechSettings(), channel=FakeDownlink(), sink=Sink(), metrics=Metrics()
    )
    port: SpeakPortShape = service  # mypy --strict checks the structure
    speak = inspect.signature(port.speak).parameters
    assert [(p.name, p.kind.name) for p in speak.values()] == [
        ("dev", "POSITIONAL_OR_KEYWORD"),
        ("speak_id", "KEYWORD_ONLY"),
        ("text", "KEYWORD_ONLY"),
        ("voice", "KEYWORD_ONLY"),
    ]
    assert list(inspect.signature(port.cancel).parameters) == ["dev", "speak_id"]


async def test_a_clip_repeated_n_times_is_one_bracket_of_n_plays(tmp_path: Path) -> None:
    """A repeater's PLAY_MEDIA repeat N on a device without an SD card (gateway/speech/sdless.py):
    the clip decoded once and streamed N times back to back; ``completed`` has all N."""
    clip = tmp_path / "tone.wav"
    with wave.open(str(clip), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(await ToneTts(ms=600).pcm(None, "", "en", 16_000))  # type: ignore[arg-type]
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts()
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)
    async with running(channel, sink, engine) as service:
        service.play_clip("d", clip_id="c", path=clip, repeat=3)
        assert await sink.end_of("c") == ("completed", "d", "c", 1800)
    assert channel.states() == ["start", "stop"]
    assert len(channel.audio) == 30


# -- phrases prepared ahead of use ------------------------------------------------------------


async def test_prepared_phrases_are_served_from_the_cache() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts(ms=300)
    channel.targets["d"] = DownlinkTarget("s1", 16_000, 60)  # the format they are made in
    service = SpeechService(
        settings=SpeechSettings(tts_lead_s=0.0, presynth=True),
        channel=channel,
        sink=sink,
        metrics=Metrics(),
        engine=engine,
    )
    service.prepare([("en", "Right!"), ("en", "It is 7."), ("en", "Right!")])  # before run()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(service.run())
        await asyncio.wait_for(service.prepared.wait(), 10)
        assert engine.calls == 2  # the repeat was already cached
        assert len(service.cache) == 2
        service.speak("d", speak_id="x", text="Right!", voice="en")
        assert (await sink.end_of("x"))[0] == "completed"
        assert engine.calls == 2  # no synthesis on first use
        assert (service.cache.hits, service.cache.misses) == (1, 0)
        service.prepare([("en", "Right!"), ("en", "Well done.")])  # a catalog reload
        await asyncio.wait_for(service.prepared.wait(), 10)
        assert engine.calls == 3  # only the new phrase
        task.cancel()


async def test_preparation_stops_before_the_cache_evicts() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts(ms=600)
    # room for about one 600 ms phrase (~10 frames of a tone)
    async with running(channel, sink, engine, presynth=True, cache_bytes=1500) as service:
        service.prepare([("en", f"phrase {i}.") for i in range(5)])
        await asyncio.wait_for(service.prepared.wait(), 10)
        assert 0 < len(service.cache) < 5
        assert service.cache.evictions == 0
        assert service.cache.bytes <= 1500


async def test_preparation_counts_a_failed_synthesis_and_goes_on() -> None:
    class Flaky(ToneTts):
        async def pcm(self, http: aiohttp.ClientSession, text: str, voice: str, rate: int) -> bytes:
            if text == "bad.":
                raise SynthesisError("espeak-ng_failed")
            return await super().pcm(http, text, voice, rate)

    metrics = Metrics()
    service = SpeechService(
        settings=SpeechSettings(presynth=True),
        channel=FakeDownlink(),
        sink=Sink(),
        metrics=metrics,
        engine=Flaky(ms=200),
    )
    service.prepare([("en", "bad."), ("en", "good.")])
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(service.run())
        await asyncio.wait_for(service.prepared.wait(), 10)
        task.cancel()
    assert len(service.cache) == 1
    figures = metrics.snapshot()
    assert figures['snlpgw_speech_synthesis_failures_total{reason="espeak-ng_failed"}'] == 1
    assert figures["snlpgw_speech_prepared_phrases"] == 1


async def test_preparation_off_prepares_nothing() -> None:
    channel, sink, engine = FakeDownlink(), Sink(), ToneTts()
    async with running(channel, sink, engine, presynth=False) as service:
        service.prepare([("en", "Right!")])
        await asyncio.sleep(0)
        assert engine.calls == 0
        assert not service.prepared.is_set()


def test_espeak_is_prepared_at_the_lowest_priority_in_its_own_thread() -> None:
    """The real engine: its synthesis runs in the preparation thread, niced."""
    service = SpeechService(
        settings=SpeechSettings(presynth=True),
        channel=FakeDownlink(),
        sink=Sink(),
        metrics=Metrics(),
    )
    niceness: list[int] = []

    async def go() -> None:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(service.run())
            await service.wait_ready()
            assert service._background is not None
            niceness.append(
                await asyncio.get_running_loop().run_in_executor(
                    service._background, os.getpriority, os.PRIO_PROCESS, 0
                )
            )
            service.prepare([("en", "Right!")])
            await asyncio.wait_for(service.prepared.wait(), 60)
            task.cancel()

    asyncio.run(go())
    assert niceness == [19]
    assert len(service.cache) == 1
