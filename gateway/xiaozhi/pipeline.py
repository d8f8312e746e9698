"""Per-session uplink audio pipeline: bounded frame queue → Opus decode (with concealment) → VAD
segmenter → :class:`VoiceSink`.

Why a queue rather than decoding inside ``datagram_received``: the endpoint does only O(1)
work per datagram (framing, ssrc lookup, address check, replay check, AES-CTR of ≤ 1.5 KB) and
appends to this session's queue. Decode + VAD run when the channel's :class:`~gateway.xiaozhi.
pump.AudioPump` gives this session its turn (at most ``batch`` frames, round-robin between
sessions, yielding to the loop between turns) — or, without a pump, in a task of the
session's own (``run``): a device that floods fills (and overflows) only its own queue and
gets only its own turns. The queue is bounded; overflow drops the
oldest frame, counts it, and turns it into a concealed gap so stream time stays exact.

A listening stretch may be *capture-only* (``set_listening(True, decode=False)``: a lesson
window the overload governor did not admit, :mod:`overload`): its frames are neither queued nor
decoded; their Opus packets are kept (at most ``packets_kept``, the archive's longest answer)
and handed over once by :meth:`AudioPipeline.take_captured` after the stretch ends.

Stream time comes from sequence numbers: frame ``seq`` covers ``[(seq-1)·60, seq·60)`` ms of the
session, so utterance boundaries do not depend on arrival pacing. Frames that arrive while the
runtime is not listening are counted and never queued or decoded; the segmenter restarts at
the next frame that arrives while listening.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from codec.vad import SpeechStarted, VadEvent
from gateway.xiaozhi.voice_ports import (
    FRAME_MS,
    Decoder,
    PipelineCounters,
    Segmenter,
    VoiceSink,
)

log = logging.getLogger(__name__)


class AudioPipeline:
    def __init__(
        self,
        *,
        dev: str,
        session_id: str,
        sink: VoiceSink,
        decoder: Decoder,
        new_segmenter: Callable[[], Segmenter],
        counters: PipelineCounters,
        capacity: int = 50,
        batch: int = 4,
        listening: bool = True,
        notify: Callable[[AudioPipeline], None] | None = None,
        packets_kept: int = 0,
    ) -> None:
        self.dev = dev
        self.session_id = session_id
        self._sink = sink
        self._decoder = decoder
        self._new_segmenter = new_segmenter
        self._segmenter: Segmenter | None = None
        self._base_ms = 0.0
        self._counters = counters
        # Bounded (capacity frames = 3 s at the default 50); overflow drops the OLDEST frame,
        # counted, and its time is concealed through the next frame's lost_before.
        self._queue: deque[tuple[bytes, int, int]] = deque()  # (opus, seq, lost_before)
        self._capacity = capacity
        self._carry_lost = 0  # frames dropped on overflow, added to the next frame's gap
        self._batch = batch
        # With a channel's AudioPump (pump.py) the pump drains this pipeline; without one,
        # ``run`` does (a task of its own, woken by ``_ready``: no Event with a pump).
        self._notify = notify
        self._ready = asyncio.Event() if notify is None else None
        self.listening = listening
        # Every frame taken while listening (its decrypted Opus packet), as it came, with this
        # pipeline's device and session (CHAT bridges it upstream): one shared callable, no
        # closure per session.
        self.tap: Callable[[str, str, bytes], None] | None = None
        # The last ``packets_kept`` decoded packets with their seq (0: none), so an utterance's
        # own Opus packets can go with its PCM (the archive muxes them, no re-encode). Bounded:
        # about the VAD's longest utterance; refs to the packets the queue held anyway.
        self._recent: deque[tuple[int, bytes]] | None = (
            deque(maxlen=packets_kept) if packets_kept > 0 else None
        )
        self._packets_kept = packets_kept
        # A capture-only stretch's packets while it runs (None: decoding or not listening),
        # then the last such stretch's until taken (None: nothing to take).
        self._capturing: list[bytes] | None = None
        self._captured: tuple[bytes, ...] | None = None

    def receive(self, opus: bytes, seq: int, lost_before: int) -> None:
        """One accepted uplink frame (the UDP endpoint's hot path): O(1), never blocks. A frame
        that arrives while nobody listens is only counted (its sequence was already accounted
        by the receiver)."""
        if not self.listening:
            self._counters.frames_skipped(1)
            return
        if self.tap is not None:
            self.tap(self.dev, self.session_id, opus)
        capturing = self._capturing
        if capturing is not None:
            if len(capturing) < self._packets_kept:
                capturing.append(opus)
            self._counters.frames_captured(1)
            return
        queue = self._queue
        queue.append((opus, seq, lost_before))  # a plain tuple: a NamedTuple costs ~9x to build
        if len(queue) > self._capacity:
            dropped = queue.popleft()
            self._carry_lost += dropped[2] + 1
            self._counters.queue_dropped(1)
        if self._notify is not None:
            self._notify(self)
        elif self._ready is not None:
            self._ready.set()

    def set_listening(self, listening: bool, *, decode: bool = True) -> None:
        """Turning listening off first processes the frames that arrived while it was on and
        closes an utterance still open (it reaches the sink); turning it on starts a fresh
        segmenter at the next frame. ``decode`` False: the stretch is capture-only (module
        docstring); a capture-only stretch that ends keeps its packets for :meth:`take_captured`."""
        capture = listening and not decode
        if listening == self.listening and capture == (self._capturing is not None):
            return
        if self._capturing is not None:
            self._captured, self._capturing = tuple(self._capturing), None
        elif self.listening:
            self.finish()
        if listening and not self.listening:
            self._captured = None  # a new stretch: what an old one left is stale
        if capture:
            self._capturing = []
        self.listening = listening
        self._segmenter = None

    def take_captured(self) -> tuple[bytes, ...] | None:
        """The last capture-only stretch's Opus packets, once (None: the stretch was decoded,
        or they were taken)."""
        captured, self._captured = self._captured, None
        return captured

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        """The session's audio task (a pipeline built without ``notify``); runs until
        cancelled."""
        ready = self._ready
        if ready is None:
            raise RuntimeError("this pipeline is drained by its channel's AudioPump")
        while True:
            if not self._queue:
                ready.clear()
                await ready.wait()
            self.drain(self._batch)
            await asyncio.sleep(0)  # yield: fairness between sessions and the socket

    def drain(self, limit: int | None = None) -> int:
        """Process up to ``limit`` queued frames (all if ``None``); returns how many. The
        decoder's counts reach the metrics once per call, not once per frame."""
        queue = self._queue
        count = len(queue) if limit is None else min(limit, len(queue))
        if not count:
            return 0
        counters = self._decoder.counters
        decoded, concealed, errors = (
            counters.frames_decoded,
            counters.concealed,
            counters.decode_errors,
        )
        process = self._process
        try:
            for _ in range(count):
                opus, seq, lost = queue.popleft()
                if self._carry_lost:
                    lost += self._carry_lost
                    self._carry_lost = 0
                process(opus, seq, lost)
        finally:
            if counters.frames_decoded != decoded:
                self._counters.frames_decoded(counters.frames_decoded - decoded)
            if counters.concealed != concealed:
                self._counters.frames_concealed(counters.concealed - concealed)
            if counters.decode_errors != errors:
                self._counters.decode_errors(counters.decode_errors - errors)
        return count

    def finish(self) -> None:
        """Session over: process what is queued (≤ capacity frames) and close an utterance in
        progress, so speech the device sent before its goodbye is not lost."""
        self.drain()
        if self._segmenter is not None:
            for event in self._segmenter.flush():
                self._deliver(event)
            self._segmenter = None

    def _process(self, opus: bytes, seq: int, lost: int) -> None:
        counters = self._decoder.counters
        resets = counters.resets
        pcm = self._decoder.decode(opus, lost)
        if self._recent is not None:
            self._recent.append((seq, opus))
        if counters.resets != resets:
            # A gap too long to conceal (codec.opus): the PCM is this frame's alone. Close what
            # was open and restart the stream clock here, so times stay exact.
            self._counters.decoder_resets(counters.resets - resets)
            if self._segmenter is not None:
                for event in self._segmenter.flush():
                    self._deliver(event)
                self._segmenter = None
            lost = 0
        segmenter = self._segmenter
        if segmenter is None:
            segmenter = self._segmenter = self._new_segmenter()
            self._base_ms = float((seq - 1 - lost) * FRAME_MS)
        events = segmenter.push(pcm)
        if events:
            for event in events:
                self._deliver(event)

    def _packets_between(self, start_ms: float, end_ms: float) -> tuple[bytes, ...]:
        """The kept packets whose frames overlap ``[start_ms, end_ms)`` (stream time)."""
        if self._recent is None:
            return ()
        return tuple(
            opus
            for seq, opus in self._recent
            if (seq - 1) * FRAME_MS < end_ms and seq * FRAME_MS > start_ms
        )

    def _deliver(self, event: VadEvent) -> None:
        try:
            if isinstance(event, SpeechStarted):
                self._sink.speech_started(self.dev, self.session_id, self._base_ms + event.at_ms)
            else:
                self._counters.segments(1)
                start_ms = self._base_ms + event.started_ms
                end_ms = self._base_ms + event.at_ms
                self._sink.speech_stopped(
                    self.dev,
                    self.session_id,
                    event.pcm,
                    start_ms,
                    end_ms,
                    packets=self._packets_between(start_ms, end_ms),
                )
        except Exception:
            log.exception("voice sink failed for %s session %s", self.dev, self.session_id)
