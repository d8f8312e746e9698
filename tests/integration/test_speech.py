"""SPEAK end to end on a real broker and real UDP: the Xiaozhi simulator (real MQTT, AES-CTR
UDP) receives ``tts start`` / ``sentence_start`` / ``stop`` and Opus frames that real libopus
decodes to espeak-ng's speech, in English and Mandarin; cancel and a closing session interrupt;
the HTTP engine is exercised against a real HTTP server the test starts (a stand-in for an
external OpenAI-compatible TTS service); the phrase cache; lesson clips (WAV, MP3)."""

from __future__ import annotations

import asyncio
import math
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import opuslib
from aiohttp import web

from devstack.gateway import gateway_settings, serving
from gateway.service import Context, Service
from gateway.simulators.xiaozhi import XiaozhiDeviceSim, encode_pcm
from gateway.speech.engines import to_pcm
from gateway.speech.service import SpeechService
from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.ota.provisioning import broker_provisioner
from tests.integration.xiaozhi_support import FAST_STREAM_PPS, VoiceRecorder, new_mac
from tests.support.broker import Broker
from tests.support.speech import silence, synthesize

RATE = 16_000
FRAME_MS = 60
FRAME_SAMPLES = RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2
EN = "Seven plus two makes nine."
ZH = "七加二等于九"
LONG = "One two three four five six seven eight nine ten, and then we count back again slowly."


class SpeechEventsRecorder:
    """The SPEAK sink, awaitable: ``(kind, dev, speak_id, detail)`` in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, object]] = []
        self._changed = asyncio.Event()

    def speak_started(self, dev: str, speak_id: str) -> None:
        self._add(("started", dev, speak_id, None))

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        self._add(("completed", dev, speak_id, duration_ms))

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        self._add(("interrupted", dev, speak_id, reason))

    def of(self, speak_id: str) -> list[tuple[str, object]]:
        return [(kind, detail) for kind, _, sid, detail in self.events if sid == speak_id]

    async def wait_end(self, speak_id: str, timeout_s: float = 30.0) -> tuple[str, object]:
        def ended() -> tuple[str, object] | None:
            return next(
                ((k, d) for k, d in self.of(speak_id) if k in ("completed", "interrupted")), None
            )

        async with asyncio.timeout(timeout_s):
            while (end := ended()) is None:
                self._changed.clear()
                await self._changed.wait()
        return end

    async def wait(self, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    def _add(self, event: tuple[str, str, str, object]) -> None:
        self.events.append(event)
        self._changed.set()


@dataclass
class SpeechRigEvents:
    """The channel's session events: the recorder's, and session ends to SPEAK."""

    recorder: VoiceRecorder
    speech: SpeechService | None = None

    def session_opened(self, dev: str, session_id: str, channel: object) -> None:
        self.recorder.session_opened(dev, session_id, channel)

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        if self.speech is not None:
            self.speech.session_closed(dev, session_id, reason)
        self.recorder.session_closed(dev, session_id, reason)

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        self.recorder.listen(dev, session_id, state, mode, text)

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        self.recorder.abort(dev, session_id, reason)

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        self.recorder.mcp_message(dev, payload)


@dataclass
class SpeechRig:
    speech: SpeechService
    sink: SpeechEventsRecorder
    channel: XiaozhiChannel
    service: Service
    ota_url: str
    devices: list[XiaozhiDeviceSim] = field(default_factory=list)

    def metric(self, name: str, **labels: str) -> float:
        value = self.service.metrics.registry.get_sample_value(f"snlpgw_{name}", labels)
        return 0.0 if value is None else value


@asynccontextmanager
async def speech_rig(broker: Broker, **speech: Any) -> AsyncIterator[SpeechRig]:
    settings = gateway_settings(broker, speech=speech)
    ctx = Context.create(settings)
    recorder = VoiceRecorder()
    events = SpeechRigEvents(recorder)
    channel = XiaozhiChannel(
        settings=settings,
        mqtt=ctx.mqtt,
        metrics=ctx.metrics,
        http=ctx.http,
        admin=ctx.admin,
        voice=recorder,
        events=events,
        provision=broker_provisioner(settings, reload=broker.reload),
        udp_rate_pps=FAST_STREAM_PPS,
    )
    sink = SpeechEventsRecorder()
    speech_service = SpeechService(
        settings=settings.speech, channel=channel, sink=sink, metrics=ctx.metrics
    )
    events.speech = speech_service
    service = Service(ctx, [channel, speech_service])
    async with serving(service, ready=(channel.wait_ready, speech_service.wait_ready)):
        yield SpeechRig(
            speech_service,
            sink,
            channel,
            service,
            f"http://127.0.0.1:{service.http.port}/xiaozhi/ota/",
        )


@asynccontextmanager
async def connected_device(rig: SpeechRig) -> AsyncIterator[tuple[str, XiaozhiDeviceSim]]:
    """A provisioned simulator with an open audio channel that has sent one datagram (the
    gateway knows its UDP address)."""
    mac = new_mac()
    sim = XiaozhiDeviceSim(mac=mac)
    await sim.provision(rig.ota_url)
    async with sim:
        await sim.open_audio_channel()
        await sim.stream_opus(encode_pcm(silence(FRAME_MS)))
        yield mac.replace(":", "_"), sim


def decode(frames: list[bytes]) -> bytes:
    decoder = opuslib.Decoder(RATE, 1)
    return b"".join(decoder.decode(frame, FRAME_SAMPLES) for frame in frames)


def peak(pcm: bytes) -> int:
    return max(abs(s) for s in memoryview(pcm).cast("h"))


def frames_for(pcm: bytes) -> int:
    return math.ceil(len(pcm) / FRAME_BYTES)


async def spoken(sim: XiaozhiDeviceSim, after: int, frames: int) -> list[dict[str, Any]]:
    """The tts messages of one utterance (start, sentence_start?, stop) after ``after``."""
    await sim.expect("tts", state="stop", after=after, timeout_s=30)
    await sim.wait_audio(frames, timeout_s=30)
    return [m for m in sim.inbox[after:] if m["type"] == "tts"]


async def test_speak_english_and_mandarin_reach_the_device_as_decodable_speech(
    broker: Broker,
) -> None:
    async with speech_rig(broker) as rig, connected_device(rig) as (dev, sim):
        for speak_id, text, voice, espeak_voice in (
            ("q1", EN, "en", "en-us"),
            ("q2", ZH, "zh", "cmn"),
        ):
            expected = frames_for(synthesize(text, voice=espeak_voice))  # espeak-ng's duration
            after, sim.downlink_audio[:] = len(sim.inbox), []
            rig.speech.speak(dev, speak_id=speak_id, text=text, voice=voice)
            assert await rig.sink.wait_end(speak_id) == ("completed", expected * FRAME_MS)
            assert rig.sink.of(speak_id)[0] == ("started", None)

            tts = await spoken(sim, after, expected)
            assert [m["state"] for m in tts] == ["start", "sentence_start", "stop"]
            assert tts[1]["text"] == text
            assert {m["session_id"] for m in tts} == {sim.hello.session_id if sim.hello else ""}
            assert len(sim.downlink_audio) == expected  # every frame, none discarded
            pcm = decode(sim.downlink_audio)
            assert len(pcm) == expected * FRAME_BYTES  # real libopus: the expected duration
            assert peak(pcm) > 1000  # speech, not silence
        assert rig.metric("speech_completed_total", kind="speak") == 2


async def test_cancel_mid_speech_interrupts_and_stops_the_device(broker: Broker) -> None:
    async with speech_rig(broker) as rig, connected_device(rig) as (dev, sim):
        total = frames_for(synthesize(LONG))
        after = len(sim.inbox)
        rig.speech.speak(dev, speak_id="long", text=LONG, voice="en")
        await sim.wait_audio(10, timeout_s=30)  # mid-speech
        rig.speech.cancel(dev, "long")
        assert await rig.sink.wait_end("long") == ("interrupted", "cancelled")
        await sim.expect("tts", state="stop", after=after, timeout_s=10)
        assert not sim.speaking
        assert 10 <= len(sim.downlink_audio) < total
        assert ("completed", total * FRAME_MS) not in rig.sink.of("long")
        rig.speech.cancel(dev, "long")  # already over: nothing more happens
        rig.speech.cancel(dev, "never-said")

        # the device speaks again afterwards; a new utterance replaces one in progress
        after = len(sim.inbox)
        rig.speech.speak(dev, speak_id="a", text=LONG, voice="en")
        await rig.sink.wait(lambda: ("started", None) in rig.sink.of("a"))
        rig.speech.speak(dev, speak_id="b", text=EN, voice="en")
        assert await rig.sink.wait_end("a") == ("interrupted", "replaced")
        assert (await rig.sink.wait_end("b"))[0] == "completed"
        assert rig.metric("speech_interrupted_total", reason="cancelled") == 1
        assert rig.metric("speech_interrupted_total", reason="replaced") == 1


async def test_a_closing_session_interrupts_and_refusals_are_reported(broker: Broker) -> None:
    async with speech_rig(broker) as rig:
        rig.speech.speak("nobody_here", speak_id="n", text=EN, voice="en")
        assert await rig.sink.wait_end("n") == ("interrupted", "no_session")
        async with connected_device(rig) as (dev, sim):
            rig.speech.speak(dev, speak_id="v", text=EN, voice="fr")
            assert await rig.sink.wait_end("v") == ("interrupted", "unknown_voice")

            rig.speech.speak(dev, speak_id="g", text=LONG, voice="en")
            await sim.wait_audio(5, timeout_s=30)
            await sim.goodbye()  # the device goes away mid-speech
            assert await rig.sink.wait_end("g") == ("interrupted", "session_closed")
        assert rig.metric("speech_interrupted_total", reason="session_closed") == 1


async def test_the_phrase_cache_speaks_a_repeated_phrase_without_synthesis(
    broker: Broker,
) -> None:
    async with speech_rig(broker) as rig, connected_device(rig) as (dev, _):
        for n in range(3):
            rig.speech.speak(dev, speak_id=f"c{n}", text="Well done!", voice="en")
            assert (await rig.sink.wait_end(f"c{n}"))[0] == "completed"
        rig.speech.speak(dev, speak_id="c3", text="太棒了", voice="zh")
        assert (await rig.sink.wait_end("c3"))[0] == "completed"
        cache = rig.speech.cache
        assert (cache.hits, cache.misses, len(cache)) == (2, 2, 2)
        assert rig.metric("speech_cache_hits_total") == 2
        assert rig.metric("speech_cache_misses_total") == 2
        assert rig.metric("speech_cache_bytes") == cache.bytes > 0


# -- the HTTP engine ----------------------------------------------------------------------------


@dataclass
class StandInTtsServer:
    """A STAND-IN for an external OpenAI-compatible TTS service (``POST /v1/audio/speech``):
    a real aiohttp server that answers with espeak-ng's WAV. The contract and SPEAK's use of
    it are under test, not this server."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200

    async def speech(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.status != 200:
            return web.json_response({"error": "stand-in refuses"}, status=self.status)
        wav = await asyncio.to_thread(espeak_wav, body["input"])
        return web.Response(body=wav, content_type="audio/wav")


def espeak_wav(text: str) -> bytes:
    return subprocess.run(
        ["espeak-ng", "-v", "en-us", "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout


@asynccontextmanager
async def stand_in_tts() -> AsyncIterator[tuple[str, StandInTtsServer]]:
    server = StandInTtsServer()
    app = web.Application()
    app.router.add_post("/v1/audio/speech", server.speech)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1/audio/speech", server
    finally:
        await runner.cleanup()


async def test_http_engine_speaks_through_the_openai_speech_contract(broker: Broker) -> None:
    async with stand_in_tts() as (url, server):
        voices = {"en": "nova", "zh": "zh-voice"}
        async with (
            speech_rig(
                broker, engine="http", http_url=url, http_model="m1", http_voices=voices
            ) as rig,
            connected_device(rig) as (dev, sim),
        ):
            expected = frames_for(to_pcm(espeak_wav(EN), "wav", RATE))
            after = len(sim.inbox)
            rig.speech.speak(dev, speak_id="h1", text=EN, voice="en")
            assert await rig.sink.wait_end("h1") == ("completed", expected * FRAME_MS)
            assert server.requests == [
                {"model": "m1", "input": EN, "voice": "nova", "response_format": "wav"}
            ]
            tts = await spoken(sim, after, expected)
            assert [m["state"] for m in tts] == ["start", "sentence_start", "stop"]
            pcm = decode(sim.downlink_audio)
            assert len(pcm) == expected * FRAME_BYTES
            assert peak(pcm) > 1000

            rig.speech.speak(dev, speak_id="h2", text=EN, voice="en")  # cached: no request
            assert (await rig.sink.wait_end("h2"))[0] == "completed"
            assert len(server.requests) == 1

            server.status = 500  # the service fails: reported, counted, nothing spoken
            rig.speech.speak(dev, speak_id="h3", text="Something new.", voice="en")
            assert await rig.sink.wait_end("h3") == ("interrupted", "synthesis_failed")
            assert rig.metric("speech_synthesis_failures_total", reason="http_status") == 1


# -- lesson clips (devices without an SD card) --------------------------------------------------


def make_clips(wav: Path, mp3: Path) -> None:
    wav.write_bytes(espeak_wav(LONG))
    subprocess.run(["sox", str(wav), str(mp3)], check=True)


def sox_pcm(path: Path) -> bytes:
    """The clip as 16 kHz mono s16le, decoded by sox directly (the expected duration)."""
    argv = ["sox", str(path), "-r", "16000", "-c", "1", "-b", "16", "-e", "signed", "-t", "raw"]
    return subprocess.run([*argv, "-"], check=True, capture_output=True).stdout


async def test_lesson_clips_stream_over_udp_with_their_duration(
    broker: Broker, tmp_path: Path
) -> None:
    wav = tmp_path / "clip.wav"
    mp3 = tmp_path / "clip.mp3"
    await asyncio.to_thread(make_clips, wav, mp3)
    async with speech_rig(broker) as rig, connected_device(rig) as (dev, sim):
        for clip_id, path in (("w", wav), ("m", mp3)):
            expected = frames_for(await asyncio.to_thread(sox_pcm, path))
            after, sim.downlink_audio[:] = len(sim.inbox), []
            rig.speech.play_clip(dev, clip_id=clip_id, path=path)
            assert await rig.sink.wait_end(clip_id) == ("completed", expected * FRAME_MS)
            tts = await spoken(sim, after, expected)
            assert [m["state"] for m in tts] == ["start", "stop"]  # no text for a clip
            decoded = decode(sim.downlink_audio)
            assert len(decoded) == expected * FRAME_BYTES
            assert peak(decoded) > 1000
        rig.speech.play_clip(dev, clip_id="gone", path=tmp_path / "missing.mp3")
        assert await rig.sink.wait_end("gone") == ("interrupted", "synthesis_failed")
        assert rig.metric("speech_synthesis_failures_total", reason="clip_missing") == 1
