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
closing (goodbye, idle expiry, a new hello) interrupts with ``session_closed``: the downlink
sees it at its next item (a frame is due every frame duration), or :meth:`session_closed`
says so at once. Events reach
the sink from the loop, never inside the caller's own call (``call_soon``), in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from gateway.speech.sentences import sentences
from gateway.speech.target import DownlinkTarget
from gateway.xiaozhi import messages

log = logging.getLogger(__name__)
MAX_TEXT_CHARS = 2000  # a step's line, not a book: longer text is refused before synthesis
# The downlink audio a hello reply announces unless CHAT holds the reply with its own
# (gateway/xiaozhi/roster.py): the format phrases are prepared in ahead of use.
PREPARED_RATE, PREPARED_FRAME_MS = 16_000, 60


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
    repeat: int = 1


@dataclass(eq=False)
class _Utterance:
    dev: str
    speak_id: str
    source: _Text | _Clip
    task: asyncio.Task[None] | None = None
    queued: bool = False  # its tts start is in the device's player
    closed: bool = False  # its tts stop is too
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
    gone: bool = False  # its session closed (seen by the downlink)

    # -- the player's Output ---------------------------------------------------------------

    def publish_down(self, payload: bytes) -> None:
        if self._current():
            self.service.channel.publish(self.dev, payload)

    def send_audio(self, opus: bytes) -> bool:
        sid = self.session_id
        if sid is not None and self.service.channel.send_audio(self.dev, sid, opus):
            self.service.metrics.frames_down.inc()
            return True
        self._current()
        return False

    def _current(self) -> bool:
        """Whether the session this device's audio is for is still the open one; the first
        time it is not, the device's speech ends (``session_closed``, on the next loop turn:
        never inside the player's own drain)."""
        if self.gone:
            return False
        target = self.service.channel.downlink_target(self.dev)
        if target is not None and target.session_id == self.session_id:
            return True
        self.gone = True
        self.service.session_gone(self)
        return False

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
        self._phrases: Sequence[tuple[str, str]] = ()  # the last prepare()'s (voice, text)
        self._preparing: asyncio.Task[None] | None = None
        self._background: ThreadPoolExecutor | None = None
        self.prepared = asyncio.Event()  # set when a preparation has run to its end

    async def run(self) -> None:
        background = ThreadPoolExecutor(
            1,
            thread_name_prefix="speech-prepare",
            initializer=_lower_priority,
            initargs=(self.settings.presynth_nice,),
        )
        async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as tg:
            self._http, self._tg, self._loop = http, tg, asyncio.get_running_loop()
            self._background = background
            self._ready.set()
            self._start_preparing()
            try:
                await asyncio.Event().wait()
            finally:
                self._ready.clear()
                self._tg = None
                if self._preparing is not None:
                    self._preparing.cancel()
                background.shutdown(wait=False, cancel_futures=True)
                for state in list(self._devices.values()):
                    self._drop_device(state, "service_stopped")

    async def wait_ready(self) -> None:
        await self._ready.wait()

    # -- phrases prepared ahead of use ---------------------------------------------------------

    def prepare(self, phrases: Sequence[tuple[str, str]]) -> None:
        """Synthesize ``(voice, sentence)`` phrases into the phrase cache in the background
        (after start-up, and again after a catalog reload: a preparation in progress is
        replaced). One phrase at a time, the synthesis at ``speech.presynth_nice``; a phrase
        already cached is skipped; it stops before the cache would evict anything (the
        budget is ``speech.cache_bytes``). Off with ``speech.presynth``."""
        if not self.settings.presynth:
            return
        self._phrases = tuple(phrases)
        if self._tg is not None:
            self._start_preparing()

    def _start_preparing(self) -> None:
        if self._tg is None or not self._phrases:
            return
        if self._preparing is not None:
            self._preparing.cancel()
        self.prepared.clear()
        self._preparing = self._tg.create_task(
            self._prepare_all(self._phrases), name="speech.prepare"
        )

    async def _prepare_all(self, phrases: Sequence[tuple[str, str]]) -> None:
        began = self._clock()
        made = cached = failed = 0
        full = False
        for voice, text in phrases:
            key = PhraseKey(self.engine.name, voice, text, PREPARED_RATE, PREPARED_FRAME_MS)
            if key in self.cache:
                cached += 1
                continue
            try:
                frames = await self._synthesize_in_background(text, voice)
            except SynthesisError as exc:
                self.metrics.failures.labels(bounded(exc.reason, FAILURES)).inc()
                failed += 1
                continue
            if self.cache.bytes + sum(len(f) for f in frames) > self.cache.max_bytes:
                full = True
                log.warning(
                    "speech: phrase cache full after %d of %d phrases prepared; raise "
                    "speech.cache_bytes to keep them all",
                    made + cached,
                    len(phrases),
                )
                break
            self.cache.put(key, frames)
            self.metrics.cache_bytes.set(self.cache.bytes)
            made += 1
        took_s = self._clock() - began
        self.metrics.prepared.set(made + cached)
        self.metrics.prepare_s.set(took_s)
        log.info(
            "speech: %d phrases prepared (%d synthesized, %d already cached, %d failed%s) "
            "in %.1f s",
            made + cached,
            made,
            cached,
            failed,
            ", cache full" if full else "",
            took_s,
        )
        self.prepared.set()

    async def _synthesize_in_background(self, text: str, voice: str) -> tuple[bytes, ...]:
        loop = asyncio.get_running_loop()
        if isinstance(self.engine, EspeakTts):  # its subprocesses inherit the thread's nice
            pcm = await loop.run_in_executor(
                self._background, self.engine.synthesize, text, voice, PREPARED_RATE
            )
        else:  # HTTP: the work is the server's
            http = self._http
            if http is None:
                raise SynthesisError("not_running")
            pcm = await self.engine.pcm(http, text, voice, PREPARED_RATE)
        return await loop.run_in_executor(
            self._background, engines.encode, pcm, PREPARED_RATE, PREPARED_FRAME_MS
        )

    # -- SpeakPort -----------------------------------------------------------------------------

    def speak(self, dev: str, *, speak_id: str, text: str, voice: str) -> None:
        """Say ``text`` in ``voice`` ("en" / "zh") on ``dev``; results go to the sink."""
        item = _Utterance(dev, speak_id, _Text(text, voice))
        if voice not in self.engine.voices() or len(text) > MAX_TEXT_CHARS:
            self.metrics.requests.labels(item.kind).inc()
            self._refuse(item, "unknown_voice" if len(text) <= MAX_TEXT_CHARS else "too_long")
            return
        self._begin(item)

    def play_clip(self, dev: str, *, clip_id: str, path: Path, repeat: int = 1) -> None:
        """Stream the clip file at ``path`` (WAV, MP3, …) to ``dev``, ``repeat`` times back to
        back in one bracket (decoded once): a device without an SD card takes lesson audio this
        way. Results go to the sink under ``clip_id``; ``completed`` has all plays' duration."""
        self._begin(_Utterance(dev, clip_id, _Clip(path, max(1, repeat))))

    def cancel(self, dev: str, speak_id: str) -> None:
        """Stop ``speak_id`` on ``dev`` (unknown or finished: nothing happens)."""
        state = self._devices.get(dev)
        if state is None or state.current is None or state.current.speak_id != speak_id:
            return
        self._interrupt(state, state.current, "cancelled")
        self._forget_if_idle(state)

    # -- session events (the Xiaozhi channel) --------------------------------------------------

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        """``dev``'s session closed (optional: the downlink also sees it at its next item, and
        a synthesis in progress checks the session when it is done)."""
        state = self._devices.get(dev)
        if state is not None and state.session_id == session_id:
            self._drop_device(state, "session_closed")

    def session_gone(self, state: _DeviceSpeech) -> None:
        """The downlink found ``state``'s session closed: its speech ends on the next turn."""
        loop = self._loop or asyncio.get_running_loop()
        loop.call_soon(self._drop_gone, state)

    def _drop_gone(self, state: _DeviceSpeech) -> None:
        if self._devices.get(state.dev) is state:
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
        """Make the audio piece by piece (a clip is one piece, a text one per sentence) and
        queue each as soon as it is made: the first sentence plays while the next is made."""
        target = self.channel.downlink_target(item.dev)
        if target is None:
            self._interrupt(state, item, "no_session")
            return
        source = item.source
        pieces: list[str | None] = (
            [None] if isinstance(source, _Clip) else list(sentences(source.text)) or [""]
        )
        total = 0
        for n, piece in enumerate(pieces):
            if isinstance(source, _Clip):
                frames = await self._clip_frames(source.path, target) * source.repeat
            else:
                frames = await self._phrase_frames(piece or "", source.voice, target)
            reachable = n > 0 or await self.channel.reachable(
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
            total += len(frames)
            if duration_ms(total, target.frame_ms) > self.settings.max_utterance_s * 1000:
                self._interrupt(state, item, "too_long")
                return
            if n == 0:
                self._open(state, item, target)
            self._queue(state, target, piece, frames)
        item.duration_ms = duration_ms(total, target.frame_ms)
        self._close(state, item)

    async def _clip_frames(self, path: Path, target: DownlinkTarget) -> tuple[bytes, ...]:
        rate, frame_ms = target.sample_rate, target.frame_ms
        async with self._slots:
            pcm = await asyncio.to_thread(engines.decode_file, path, rate)
            return await asyncio.to_thread(engines.encode, pcm, rate, frame_ms)

    async def _phrase_frames(
        self, text: str, voice: str, target: DownlinkTarget
    ) -> tuple[bytes, ...]:
        if not text:
            return ()
        rate, frame_ms = target.sample_rate, target.frame_ms
        key = PhraseKey(self.engine.name, voice, text, rate, frame_ms)
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
            pcm = await self.engine.pcm(http, text, voice, rate)
            frames = await asyncio.to_thread(engines.encode, pcm, rate, frame_ms)
        self.metrics.synth_ms.labels(self.engine.name).observe((self._clock() - began) * 1000)
        self.cache.put(key, frames)
        self.metrics.cache_bytes.set(self.cache.bytes)
        return frames

    def _open(self, state: _DeviceSpeech, item: _Utterance, target: DownlinkTarget) -> None:
        """``tts start`` of ``item`` (a player for the session first, if need be)."""
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
        state.player.set_frame_ms(target.frame_ms)
        item.queued = True
        state.brackets.append(item)
        state.player.json(messages.tts(target.session_id, "start"), tts="start")

    def _queue(
        self,
        state: _DeviceSpeech,
        target: DownlinkTarget,
        sentence: str | None,
        frames: tuple[bytes, ...],
    ) -> None:
        player = state.player
        if player is None:  # _open made it; a dropped device has none
            return
        if sentence is not None:
            player.json(messages.tts(target.session_id, "sentence_start", sentence))
        for frame in frames:
            player.audio(frame)

    def _close(self, state: _DeviceSpeech, item: _Utterance) -> None:
        """``tts stop`` of ``item`` (once: the bracket closes, played or interrupted)."""
        if item.closed or state.player is None or state.session_id is None:
            return
        item.closed = True
        state.player.json(messages.tts(state.session_id, "stop"), tts="stop")

    def bracket(self, state: _DeviceSpeech, tts: str) -> None:
        """A ``tts start`` / ``tts stop`` of the device's player went out."""
        if not state.brackets or state.gone:
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
            self._close(state, item)
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


def _lower_priority(nice: int) -> None:
    """The preparation thread (and the espeak-ng/sox it starts) at ``nice`` (by default the
    lowest priority: ``speech.presynth_nice``)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


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
