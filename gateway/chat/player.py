"""What goes down to one device in CHAT, in order: control JSON and paced TTS audio.

Server JSON (``stt``, ``tts``, ``llm``, ``mcp``…) and Opus frames share one ordered queue so a
``sentence_start`` stays with its audio and ``tts stop`` never overtakes the frames before it.
Audio is paced like :mod:`gateway.xiaozhi.downlink` (its :class:`Pacing`: a pre-buffer of
frames at once, then one per frame duration on deadlines from the burst's start); ``tts stop``
waits until the device had time to play what it holds. After ``tts start`` the audio holds back
``lead_s`` (control goes through the broker, audio straight over UDP, and devices discard audio
that arrives before ``tts start``).

Queue: bounded at ``capacity`` audio frames; overflow drops the newest frame (counted) — the
upstream paces its own sending, so a full queue means a stalled device path. Control JSON is
never dropped: more than ``control_capacity`` messages waiting means the upstream floods, and
:meth:`json` returns False so the caller ends the session instead. :meth:`clear` drops the
queued audio (abort, a task starting, session gone).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.xiaozhi.downlink import Pacing


@dataclass(frozen=True, slots=True)
class Json:
    payload: bytes
    tts: str | None = None  # "start" / "stop" for the state messages the core follows


@dataclass(frozen=True, slots=True)
class Audio:
    opus: bytes


class Player:
    def __init__(
        self,
        *,
        publish: Callable[[bytes], None],
        send_audio: Callable[[bytes], bool],
        on_tts: Callable[[str], None],
        clock: Callable[[], float],
        count_drop: Callable[[str], None] = lambda reason: None,
        pacing: Pacing | None = None,
        capacity: int = 500,
        control_capacity: int = 256,
        lead_s: float = 0.2,
    ) -> None:
        self._publish = publish
        self._send_audio = send_audio
        self._on_tts = on_tts
        self._clock = clock
        self._count_drop = count_drop
        self._pacing = pacing or Pacing()
        self._capacity = capacity
        self._control_capacity = control_capacity
        self._lead_s = lead_s
        self._queue: deque[Json | Audio] = deque()
        self._audio_queued = 0
        self._wake = asyncio.Event()
        self._start = 0.0  # burst start (monotonic s)
        self._index = 0  # frames into the burst
        self._last_due: float | None = None
        self.speaking = False

    def json(self, payload: bytes, tts: str | None = None) -> bool:
        if len(self._queue) - self._audio_queued >= self._control_capacity:
            self._count_drop("downlink_control_overflow")
            return False
        self._queue.append(Json(payload, tts))
        self._wake.set()
        return True

    def audio(self, opus: bytes) -> None:
        if self._audio_queued >= self._capacity:
            self._count_drop("downlink_overflow")
            return
        self._queue.append(Audio(opus))
        self._audio_queued += 1
        self._wake.set()

    def clear(self) -> int:
        """Drop queued audio (control stays, in order); returns how many frames."""
        dropped = self._audio_queued
        if dropped:
            self._queue = deque(item for item in self._queue if isinstance(item, Json))
            self._audio_queued = 0
        return dropped

    def reset(self) -> None:
        """The session is over: drop everything queued, control included (it named that
        session), and forget the speaking state."""
        self._queue.clear()
        self._audio_queued = 0
        self._last_due = None
        self.speaking = False

    @property
    def idle(self) -> bool:
        return not self._queue

    async def run(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = self._queue[0]
            delay = self._delay(item)
            if delay > 0:
                self._wake.clear()
                try:  # woken early by clear()/new items: re-evaluate the head
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            self._queue.popleft()
            if isinstance(item, Audio):
                self._audio_queued -= 1
                self._play(item)
            else:
                self._control(item)

    def _delay(self, item: Json | Audio) -> float:
        now = self._clock()
        if isinstance(item, Audio):
            due = self._pacing.due(self._index, self._start)
            if now > due + self._frame_s:  # the stream stalled (or never began): new burst
                self._start, self._index = now, 0
                due = now
            return due - now
        if item.tts == "stop" and self._last_due is not None:
            return self._last_due + (self._pacing.prebuffer + 2) * self._frame_s - now
        return 0.0

    def _play(self, item: Audio) -> None:
        self._last_due = self._pacing.due(self._index, self._start)
        self._index += 1
        if not self._send_audio(item.opus):  # the sender stamps headers (codec.counter_space)
            self._count_drop("downlink_refused")

    def _control(self, item: Json) -> None:
        self._publish(item.payload)
        if item.tts == "start":
            self.speaking = True
            self._start, self._index, self._last_due = self._clock() + self._lead_s, 0, None
        elif item.tts == "stop":
            self.speaking = False
            self._last_due = None
        if item.tts is not None:
            self._on_tts(item.tts)

    @property
    def _frame_s(self) -> float:
        return self._pacing.frame_ms / 1000
