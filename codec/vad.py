"""Server-side VAD segmentation of decoded uplink PCM (webrtcvad), in stream time.

:class:`VadSegmenter` takes 16-bit mono PCM in any chunk size (normally one 60 ms frame of
1920 bytes from the decoder), classifies 10/20/30 ms sub-frames with webrtcvad, and runs a
two-state machine (:class:`VadState`) with hysteresis counted in sub-frames:

* ``SILENCE`` → ``SPEECH`` when at least ``start_ratio`` of the last ``start_window_ms`` of
  sub-frames are voiced. ``SpeechStarted.at_ms`` is the first voiced sub-frame of that window.
* ``SPEECH`` → ``SILENCE`` after ``end_silence_ms`` of unvoiced sub-frames.
  ``SpeechStopped.at_ms`` is the end of the last voiced sub-frame, not the end of the hangover.
  webrtcvad flags about 120 ms after speech as voiced (its built-in overhang); trailing voiced
  sub-frames ``tail_trim_db`` below the utterance's peak (at most ``tail_trim_ms`` of them) are
  not counted, so the end lands on the speech, not on the overhang.

Times are milliseconds of audio pushed since the segmenter was created (sub-frame counts; never
the wall clock), so a caller that pushes concealed frames for lost packets keeps them exact.

``SpeechStopped.pcm`` holds the utterance with up to ``pre_roll_ms`` of audio before the start
and up to ``pre_roll_ms`` after the end. Speech that reaches ``max_utterance_ms`` is cut there:
the event has ``truncated=True``, a new utterance starts at once, and ``splits`` counts it.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad

_RATES = (8000, 16000, 32000, 48000)


@dataclass(frozen=True, slots=True)
class VadConfig:
    sample_rate: int = 16_000
    aggressiveness: int = 2  # webrtcvad mode 0 (least) .. 3 (most aggressive)
    subframe_ms: int = 30  # 10, 20 or 30
    start_window_ms: int = 300
    start_ratio: float = 0.5
    end_silence_ms: int = 300
    pre_roll_ms: int = 300
    max_utterance_ms: int = 15_000
    tail_trim_ms: int = 150  # at most this much of webrtcvad's overhang is trimmed off the end
    tail_trim_db: float = 40.0  # ... where sub-frames are this far below the utterance's peak

    def __post_init__(self) -> None:
        if self.sample_rate not in _RATES:
            raise ValueError(f"sample_rate must be one of {_RATES}, got {self.sample_rate}")
        if self.aggressiveness not in range(4):
            raise ValueError(f"aggressiveness must be 0..3, got {self.aggressiveness}")
        if self.subframe_ms not in (10, 20, 30):
            raise ValueError(f"subframe_ms must be 10, 20 or 30, got {self.subframe_ms}")
        if not 0.0 < self.start_ratio <= 1.0:
            raise ValueError(f"start_ratio must be in (0, 1], got {self.start_ratio}")
        if min(self.start_window_ms, self.end_silence_ms, self.max_utterance_ms) <= 0:
            raise ValueError("start_window_ms, end_silence_ms and max_utterance_ms must be > 0")
        if min(self.pre_roll_ms, self.tail_trim_ms) < 0:
            raise ValueError("pre_roll_ms and tail_trim_ms must be >= 0")

    def frames(self, ms: int) -> int:
        """Sub-frames covering ``ms`` (rounded up)."""
        return math.ceil(ms / self.subframe_ms)


class VadState(enum.Enum):
    SILENCE = "silence"
    SPEECH = "speech"


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    at_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    at_ms: int
    pcm: bytes
    duration_ms: int
    truncated: bool
    started_ms: int


VadEvent = SpeechStarted | SpeechStopped
_SILENCE = VadState.SILENCE


@dataclass(slots=True)
class VadCounters:
    subframes: int = 0
    voiced: int = 0
    segments: int = 0  # SpeechStopped events, split pieces included
    splits: int = 0  # utterances cut at max_utterance_ms


class VadSegmenter:
    """Pure, clock-free utterance segmenter; one per session."""

    def __init__(self, config: VadConfig | None = None) -> None:
        self.config = cfg = config or VadConfig()
        self.state = VadState.SILENCE
        self.counters = VadCounters()
        self._vad = webrtcvad.Vad(cfg.aggressiveness)
        # webrtcvad's C entry point: Vad.is_speech only re-checks the length we already fix.
        self._is_speech = webrtcvad._webrtcvad.process
        self._sub_bytes = cfg.sample_rate * cfg.subframe_ms // 1000 * 2
        self._window_n = cfg.frames(cfg.start_window_ms)
        self._start_n = math.ceil(cfg.start_ratio * self._window_n)
        self._end_n = cfg.frames(cfg.end_silence_ms)
        self._pre_n = cfg.frames(cfg.pre_roll_ms)
        self._max_n = cfg.frames(cfg.max_utterance_ms)
        self._trim_n = cfg.tail_trim_ms // cfg.subframe_ms
        self._trim_ratio = 10 ** (-cfg.tail_trim_db / 10)
        self._window: deque[int] = deque(maxlen=self._window_n)  # decisions (1/0), newest last
        self._in_window = 0  # voiced decisions in _window
        self._history: deque[bytes] = deque(maxlen=self._window_n + self._pre_n)  # sub-frame PCM
        self._rest = b""  # an incomplete sub-frame carried to the next push
        self._idx = -1  # index of the current sub-frame
        # The utterance so far, one bytes object per sub-frame (joined once, when it ends: a
        # growing bytearray copied itself over and over on the way to seconds of audio).
        self._utt: list[bytes] = []
        self._utt_first = 0  # sub-frame index of _utt[0]
        self._start = 0  # first voiced sub-frame of the utterance
        self._last_voiced = 0
        self._silent_run = 0

    def push(self, pcm: bytes) -> list[VadEvent]:
        """Feed PCM; return the events it completes, oldest first."""
        data = self._rest + pcm if self._rest else pcm
        size = self._sub_bytes
        whole = len(data) - len(data) % size
        self._rest = data[whole:]
        events: list[VadEvent] = []
        # One sub-frame per iteration, the state machine inline (this runs for every 60 ms
        # frame of every listening session): SILENCE counts voiced sub-frames in the start
        # window (a running count, not a count of the window per sub-frame); SPEECH extends the
        # utterance until end_silence_ms of unvoiced ones.
        is_speech, handle, rate = self._is_speech, self._vad._vad, self.config.sample_rate
        samples, history, window = size // 2, self._history, self._window
        window_n, start_n, in_window = self._window_n, self._start_n, self._in_window
        voiced_total = 0
        for offset in range(0, whole, size):
            sub = data[offset : offset + size]
            self._idx = idx = self._idx + 1
            voiced = is_speech(handle, rate, sub, samples)
            voiced_total += voiced
            history.append(sub)
            if self.state is _SILENCE:
                if len(window) == window_n:
                    in_window -= window[0]  # about to fall out of the window
                window.append(voiced)
                in_window += voiced
                if voiced and in_window >= start_n:
                    self._begin(events)
                continue
            self._utt.append(sub)
            if not voiced:
                self._silent_run += 1
                if self._silent_run >= self._end_n:
                    self._stop(events)
                    in_window = 0  # _stop cleared the window
                continue
            self._last_voiced = idx
            self._silent_run = 0
            if idx + 1 - self._start >= self._max_n:
                self._split(events)
        self._in_window = in_window
        counters = self.counters
        counters.subframes += whole // size
        counters.voiced += voiced_total
        return events

    def flush(self) -> list[VadEvent]:
        """End of stream: close an open utterance and forget partial input."""
        events: list[VadEvent] = []
        if self.state is VadState.SPEECH:
            self._stop(events)
        self._rest = b""
        return events

    def _begin(self, events: list[VadEvent]) -> None:
        window = list(self._window)
        start = self._idx - len(window) + 1 + window.index(True)
        keep = min(len(self._history), self._idx - start + 1 + self._pre_n)
        history = list(self._history)
        self._utt = history[len(history) - keep :]
        self._utt_first = self._idx - keep + 1
        self._start = start
        self._last_voiced = self._idx
        self._silent_run = 0
        self.state = VadState.SPEECH
        events.append(SpeechStarted(self._ms(start)))

    def _stop(self, events: list[VadEvent]) -> None:
        self._last_voiced = self._trim_overhang()
        post = min(self._pre_n, self._idx - self._last_voiced)
        end_n = self._last_voiced + 1 + post - self._utt_first
        self._emit(
            events,
            self._last_voiced + 1,
            b"".join(self._utt[:end_n]),
        )
        self.state = VadState.SILENCE
        self._window.clear()
        self._in_window = 0
        self._utt = []

    def _trim_overhang(self) -> int:
        """The utterance's last voiced sub-frame, minus webrtcvad's overhang on near-silence.

        webrtcvad keeps flagging a few sub-frames after speech ends (its built-in overhang,
        about 120 ms). Trailing sub-frames ``tail_trim_db`` below the loudest sub-frame of the
        utterance are not speech whatever the VAD says; at most ``tail_trim_ms`` are trimmed,
        so in a noisy room (noise above that floor) the VAD's own decision stands.
        """
        first = self._start - self._utt_first
        last = self._last_voiced - self._utt_first
        if last < first:  # an utterance split off just before silence has no voiced sub-frame
            return self._last_voiced
        spf = self._sub_bytes // 2
        x = np.frombuffer(b"".join(self._utt[first : last + 1]), dtype="<i2")
        frames = x.astype(np.float32).reshape(last - first + 1, spf)
        energy = np.einsum("ij,ij->i", frames, frames)
        floor = float(energy.max()) * self._trim_ratio
        k = last - first
        while k > max(0, last - first - self._trim_n) and energy[k] < floor:
            k -= 1
        return k + self._start

    def _split(self, events: list[VadEvent]) -> None:
        self.counters.splits += 1
        self._emit(events, self._idx + 1, b"".join(self._utt), truncated=True)
        self._utt = []
        self._utt_first = self._start = self._idx + 1
        events.append(SpeechStarted(self._ms(self._start)))

    def _emit(self, events: list[VadEvent], end: int, pcm: bytes, truncated: bool = False) -> None:
        self.counters.segments += 1
        end = max(end, self._start)
        events.append(
            SpeechStopped(
                at_ms=self._ms(end),
                pcm=pcm,
                duration_ms=self._ms(end - self._start),
                truncated=truncated,
                started_ms=self._ms(self._start),
            )
        )

    def _ms(self, subframes: int) -> int:
        return subframes * self.config.subframe_ms
