"""The SPEAK shell: text or a lesson clip → Opus → a Xiaozhi device's voice channel, with
started / completed / interrupted events for the task runtime.

``speak`` / ``play_clip`` / ``cancel`` are called on the loop and return at once (fire and
forget). Synthesis (or clip decoding) runs as one task in the service's TaskGroup, bounded by a
semaphore; its frames go down through CHAT's downlink :class:`~gateway.chat.player.Player`
(one per speaking device: ``tts start`` → ``sentence_start`` with the text → Opus frames paced
by their duration → ``tts stop``), so SPEAK and CHAT share one downlink path and its pacing
rules. The player's ``tts start`` and ``tts stop`` going out are ``started`` and ``completed``.

One utterance per device: a new one interrupts the one in progress (``replaced``). Cancelling
drops the queued audio; the utterance's ``tts stop`` still goes (the device leaves its
speaking state) and ``interrupted(cancelled)`` is reported at once. The device's session
closing (goodbye, idle expiry, a new hello) interrupts with ``session_closed``. Events reach
the sink from the loop, never inside the caller's own call (``call_soon``), in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

from gateway.chat.framing import opus_packet_ms
from gateway.chat.player import Player
from gateway.metrics import Metrics
from gateway.settings import SpeechSettings
from gateway.speech import engines
from gateway.speech.cache import PhraseCache, PhraseKey
from gateway.speech.engines import EspeakTts, HttpTts, SynthesisError, TtsEngine
from gateway.speech.frames import duration_ms
from gateway.speech.metrics import FAILURES, REASONS, SpeechMetrics, bounded
from gateway.xiaozhi import messages
from gateway.xiaozhi.channel import DownlinkTarget

log = logging.getLogger(__name__)


class SpeechSink(Protocol):
    """Where SPEAK's results go (the task runtime's inbox)."""

    def speak_started(self, dev: str, speak_id: str) -> None: ...

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None: ...

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None: ...


class SpeechChannel(Protocol):
    """What SPEAK uses of the Xiaozhi channel."""

    def downlink_target(self, dev: str) -> DownlinkTarget | None: ...

    async def reachable(self, dev: str, session_id: str, timeout_s: float) -> bool: ...

    def publish(self, dev: str, payload: bytes) -> None: ...

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool: ...


class SpeechEventLog:
    """A sink that only logs (no task runtime takes SPEAK's events yet)."""

    def speak_started(self, dev: str, speak_id: str) -> None:
        log.debug("speak %s started on %s", speak_id, dev)

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        log.debug("speak %s completed on %s (%d ms)", speak_id, dev, duration_ms)

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        log.info("speak %s interrupted on %s: %s", speak_id, dev, reason)


@dataclass(frozen=True, slots=True)
class _Text:
    text: str
    voice: str


@dataclass(frozen=True, slots=True)
class _Clip:
    path: Path


@dataclass(eq=False)
class _Utterance:
    dev: str
    speak_id: str
    source: _Text | _Clip
    task: asyncio.Task[None] | None = None
    queued: bool = False  # its items are in the device's player
    started: bool = False
    ended: bool = False  # completed or interrupted (reported)
    duration_ms: int = 0

    @property
    def kind(self) -> str:
        return "speak" if isinstance(self.source, _Text) else "clip"


@dataclass(eq=False)
class _DeviceSpeech:
    """One speaking device: its player and the utterances whose tts brackets it holds, in
    order (each gives one ``tts start`` and one ``tts stop``)."""

    dev: str
    service: SpeechService
    session_id: str | None = None
    current: _Utterance | None = None
    brackets: deque[_Utterance] = field(default_factory=deque)
    player: Player | None = None

    # -- the player's Output ---------------------------------------------------------------

    def publish_down(self, payload: bytes) -> None:
        self.service.channel.publish(self.dev, payload)

    def send_audio(self, opus: bytes) -> bool:
        sid = self.session_id
        sent = sid is not None and self.service.channel.send_audio(self.dev, sid, opus)
        if sent:
            self.service.metrics.frames_down.inc()
        return sent

    def on_tts(self, state: str) -> None:
        self.service.bracket(self, state)

    def count_drop(self, reason: str) -> None:
        self.service.metrics.dropped.labels(reason).inc()

    def count_failure(self) -> None:
        self.service.metrics.dropped.labels("send_failed").inc()


class SpeechService:
    """SPEAK: implements the task runtime's ``SpeakPort`` (``speak`` / ``cancel``) and
    ``play_clip``; a service component (its TaskGroup runs the syntheses)."""

    name = "speech"

    def __init__(
        self,
        *,
        settings: SpeechSettings,
        channel: SpeechChannel,
        sink: SpeechSink,
        metrics: Metrics,
        engine: TtsEngine | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.channel = channel
        self.sink = sink
        self.metrics = SpeechMetrics(metrics)
        self.engine = engine or build_engine(settings)
        self.cache = PhraseCache(settings.cache_bytes)
        self._clock = clock
        self._devices: dict[str, _DeviceSpeech] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(settings.synth_concurrency)
        self._ready = asyncio.Event()

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as tg:
            self._http, self._tg, self._loop = http, tg, asyncio.get_running_loop()
            self._ready.set()
            try:
                await asyncio.Event().wait()
            finally:
                self._ready.clear()
                self._tg = None
                for state in list(self._devices.values()):
                    self._drop_device(state, "service_stopped")

    async def wait_ready(self) -> None:
        await self._ready.wait()

    # -- SpeakPort -----------------------------------------------------------------------------

    def speak(self, dev: str, *, speak_id: str, text: str, voice: str) -> None:
        """Say ``text`` in ``voice`` ("en" / "zh") on ``dev``; results go to the sink."""
        item = _Utterance(dev, speak_id, _Text(text, voice))
        if voice not in self.engine.voices():
            self.metrics.requests.labels(item.kind).inc()
            self._refuse(item, "unknown_voice")
            return
        self._begin(item)

    def play_clip(self, dev: str, *, clip_id: str, path: Path) -> None:
        """Stream the clip file at ``path`` (WAV, MP3, …) to ``dev``: a device without an SD
        card takes lesson audio this way. Results go to the sink under ``clip_id``."""
        self._begin(_Utterance(dev, clip_id, _Clip(path)))

    def cancel(self, dev: str, speak_id: str) -> None:
        """Stop ``speak_id`` on ``dev`` (unknown or finished: nothing happens)."""
        state = self._devices.get(dev)
        if state is None or state.current is None or state.current.speak_id != speak_id:
            return
        self._interrupt(state, state.current, "cancelled")
        self._forget_if_idle(state)

    # -- session events (the Xiaozhi channel) --------------------------------------------------

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        state = self._devices.get(dev)
        if state is not None and state.session_id in (None, session_id):
            self._drop_device(state, "session_closed")

    # -- internals -----------------------------------------------------------------------------

    def _begin(self, item: _Utterance) -> None:
        self.metrics.requests.labels(item.kind).inc()
        if self._tg is None or self._loop is None:
            self._refuse(item, "not_running")
            return
        state = self._devices.get(item.dev)
        if state is None:
            if len(self._devices) >= self.settings.max_devices:
                self._refuse(item, "busy")
                return
            state = self._devices[item.dev] = _DeviceSpeech(item.dev, self)
            self.metrics.speaking.set(len(self._devices))
        if state.current is not None:
            self._interrupt(state, state.current, "replaced")
        state.current = item
        item.task = self._tg.create_task(self._utter(state, item), name=f"speech[{item.dev}]")

    async def _utter(self, state: _DeviceSpeech, item: _Utterance) -> None:
        try:
            await self._prepare_and_queue(state, item)
        except SynthesisError as exc:
            self.metrics.failures.labels(bounded(exc.reason, FAILURES)).inc()
            log.warning("speech for %s failed: %s", item.dev, exc.reason)
            self._interrupt(state, item, "synthesis_failed")
        except asyncio.CancelledError:
            if not item.ended:  # not ours (the service stops): cancellation goes on
                raise
            # cancelled, replaced or the device dropped: already reported
        except Exception:
            log.exception("speech for %s failed", item.dev)
            self._interrupt(state, item, "synthesis_failed")
        finally:
            item.task = None
            self._forget_if_idle(state)

    async def _prepare_and_queue(self, state: _DeviceSpeech, item: _Utterance) -> None:
        target = self.channel.downlink_target(item.dev)
        if target is None:
            self._interrupt(state, item, "no_session")
            return
        frames = await self._frames(item, target)
        reachable = await self.channel.reachable(
            item.dev, target.session_id, self.settings.address_wait_s
        )
        if item.ended:
            return
        current = self.channel.downlink_target(item.dev)
        if current is None or current.session_id != target.session_id:
            self._interrupt(state, item, "session_closed")
            return
        if not reachable:
            self._interrupt(state, item, "device_unreachable")
            return
        if duration_ms(len(frames), target.frame_ms) > self.settings.max_utterance_s * 1000:
            self._interrupt(state, item, "too_long")
            return
        self._queue(state, item, target, frames)

    async def _frames(self, item: _Utterance, target: DownlinkTarget) -> tuple[bytes, ...]:
        rate, frame_ms = target.sample_rate, target.frame_ms
        source = item.source
        if isinstance(source, _Clip):
            async with self._slots:
                pcm = await asyncio.to_thread(engines.decode_file, source.path, rate)
                return await asyncio.to_thread(engines.encode, pcm, rate, frame_ms)
        key = PhraseKey(self.engine.name, source.voice, source.text, rate, frame_ms)
        cached = self.cache.get(key)
        if cached is not None:
            self.metrics.cache_hits.inc()
            return cached
        self.metrics.cache_misses.inc()
        http = self._http
        if http is None:  # the service stopped meanwhile
            raise SynthesisError("not_running")
        began = self._clock()
        async with self._slots:
            pcm = await self.engine.pcm(http, source.text, source.voice, rate)
            frames = await asyncio.to_thread(engines.encode, pcm, rate, frame_ms)
        self.metrics.synth_ms.labels(self.engine.name).observe((self._clock() - began) * 1000)
        self.cache.put(key, frames)
        self.metrics.cache_bytes.set(self.cache.bytes)
        return frames

    def _queue(
        self,
        state: _DeviceSpeech,
        item: _Utterance,
        target: DownlinkTarget,
        frames: tuple[bytes, ...],
    ) -> None:
        if state.player is None or state.session_id != target.session_id:
            if state.player is not None:
                state.player.close()
            state.session_id = target.session_id
            state.player = Player(
                out=state,
                loop=asyncio.get_running_loop(),
                clock=self._clock,
                capacity=max(1, int(self.settings.max_utterance_s * 1000 / target.frame_ms)),
                lead_s=self.settings.tts_lead_s,
                duration=opus_packet_ms,
            )
        player = state.player
        player.set_frame_ms(target.frame_ms)
        sid = target.session_id
        item.queued = True
        item.duration_ms = duration_ms(len(frames), target.frame_ms)
        state.brackets.append(item)
        player.json(messages.tts(sid, "start"), tts="start")
        if isinstance(item.source, _Text):
            player.json(messages.tts(sid, "sentence_start", item.source.text))
        for frame in frames:
            player.audio(frame)
        player.json(messages.tts(sid, "stop"), tts="stop")

    def bracket(self, state: _DeviceSpeech, tts: str) -> None:
        """A ``tts start`` / ``tts stop`` of the device's player went out."""
        if not state.brackets:
            return
        item = state.brackets[0]
        if tts == "start":
            if not item.ended and not item.started:
                item.started = True
                self._emit(self.sink.speak_started, item.dev, item.speak_id)
            return
        state.brackets.popleft()
        if not item.ended:
            item.ended = True
            self.metrics.completed.labels(item.kind).inc()
            self._emit(self.sink.speak_completed, item.dev, item.speak_id, item.duration_ms)
        if state.current is item:
            state.current = None
        self._forget_if_idle(state)

    def _interrupt(self, state: _DeviceSpeech, item: _Utterance, reason: str) -> None:
        if item.ended:
            return
        item.ended = True
        if state.current is item:
            state.current = None
        if item.task is not None and item.task is not asyncio.current_task():
            item.task.cancel()
        if item.queued and state.player is not None:
            state.player.clear()  # its audio; its tts stop still goes (the bracket closes)
        self.metrics.interrupted.labels(bounded(reason, REASONS)).inc()
        self._emit(self.sink.speak_interrupted, item.dev, item.speak_id, reason)

    def _refuse(self, item: _Utterance, reason: str) -> None:
        item.ended = True
        self.metrics.interrupted.labels(bounded(reason, REASONS)).inc()
        self._emit(self.sink.speak_interrupted, item.dev, item.speak_id, reason)

    def _drop_device(self, state: _DeviceSpeech, reason: str) -> None:
        """The session is gone (or the service stops): everything of the device ends."""
        for item in [*state.brackets, *([state.current] if state.current else [])]:
            self._interrupt(state, item, reason)
        state.brackets.clear()
        if state.player is not None:
            state.player.close()
            state.player = None
        self._devices.pop(state.dev, None)
        self.metrics.speaking.set(len(self._devices))

    def _forget_if_idle(self, state: _DeviceSpeech) -> None:
        busy = state.current is not None or state.brackets
        if busy or (state.player is not None and not state.player.idle):
            return
        if state.player is not None:
            state.player.close()
        if self._devices.get(state.dev) is state:
            del self._devices[state.dev]
            self.metrics.speaking.set(len(self._devices))

    def _emit(self, call: Callable[..., None], *args: object) -> None:
        loop = self._loop or asyncio.get_running_loop()
        loop.call_soon(_deliver, call, args)


def _deliver(call: Callable[..., None], args: tuple[object, ...]) -> None:
    try:
        call(*args)
    except Exception:
        log.exception("speech event handler failed")


def build_engine(settings: SpeechSettings) -> TtsEngine:
    if settings.engine == "http" and settings.http_url is not None:  # the validator: both
        return HttpTts(
            url=settings.http_url,
            model=settings.http_model,
            voices=settings.http_voices,
            timeout_s=settings.http_timeout_s,
        )
    return EspeakTts(settings.espeak_voices, wpm=settings.espeak_wpm)
