"""What goes down to one device in CHAT, in order: control JSON and paced TTS audio.

Server JSON (``stt``, ``tts``, ``llm``, ``mcp``…) and Opus frames share one ordered queue so a
``sentence_start`` stays with its audio and ``tts stop`` never overtakes the frames before it.
Audio is paced like :mod:`gateway.xiaozhi.downlink` (its :class:`Pacing`: a pre-buffer at
once, then each frame on a deadline from the burst's start), by the frames' real durations:
``duration(opus)`` (the TOC byte's, :func:`~gateway.chat.framing.opus_packet_ms`) or, when it
gives none, the announced frame duration (:meth:`set_frame_ms`, from the server's hello);
``tts stop`` waits until the device had time to play what it holds. After ``tts start`` the
audio holds back ``lead_s``: control goes through the broker, audio straight over UDP, and the
firmware drops audio that arrives before its ``tts start`` was handled (``OnIncomingAudio``
plays only in the Speaking state). The lead is the broker hop, measured
(bench/results/chat_tts.md), not a guess.

Queue: bounded at ``capacity`` audio frames; overflow drops the newest frame (counted) — the
upstream paces its own sending, so a full queue means a stalled device path. Control JSON is
never dropped: more than ``control_capacity`` messages waiting means the upstream floods, and
:meth:`json` returns False so the caller ends the session instead. :meth:`clear` drops the
queued audio (abort, a task starting, session gone).

No task per device: the player is callbacks on the loop (as the task actor,
:mod:`gateway.tasks.actor`). A new item while no timer is armed, and :meth:`clear` when
control stays queued, schedule a drain for the next turn of the loop (what a task's wake-up
took; :meth:`reset` empties the queue and only disarms); the drain sends
every item that is due and arms ONE ``loop.call_at`` handle for the head item's due time, whose
firing drains again. An item whose sending raises is logged and counted (``count_failure``);
the next items still go and no other device is touched. After :meth:`close` nothing runs.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from gateway.xiaozhi.downlink import Pacing

log = logging.getLogger(__name__)
_PACING = Pacing()


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """What CHAT uses of the event loop (a fake loop clock in unit tests)."""

    def time(self) -> float: ...

    def call_soon(self, callback: Callable[[], object]) -> Cancellable: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable: ...


class Output(Protocol):
    """Where the player's items go: the device's CHAT (one object, no per-player closures)."""

    def publish_down(self, payload: bytes) -> None: ...

    def send_audio(self, opus: bytes) -> bool: ...

    def on_tts(self, state: str) -> None: ...

    def count_drop(self, reason: str) -> None: ...

    def count_failure(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Json:
    payload: bytes
    tts: str | None = None  # "start" / "stop" for the state messages the core follows
    report: bool = True  # False: a cue's own ``tts start``, not the core's business


@dataclass(frozen=True, slots=True)
class Audio:
    opus: bytes


class Player:
    def __init__(
        self,
        *,
        out: Output,
        loop: Scheduler,
        clock: Callable[[], float],
        pacing: Pacing = _PACING,
        capacity: int = 500,
        control_capacity: int = 256,
        lead_s: float = 0.2,
        duration: Callable[[bytes], float | None] = lambda opus: None,
    ) -> None:
        self._out = out
        self._loop = loop
        self._clock = clock
        self._pacing = pacing
        self._capacity = capacity
        self._control_capacity = control_capacity
        self._lead_s = lead_s
        self._duration = duration
        self._queue: deque[Json | Audio] = deque()
        self._audio_queued = 0
        self._drain_handle: Cancellable | None = None  # a drain due in the next turn
        self._timer: Cancellable | None = None  # the head item's due time
        self._draining = False  # inside _drain: what changes the queue is seen by it
        self._closed = False
        self._start = 0.0  # burst start (monotonic s)
        self._played_ms = 0.0  # audio sent in this burst
        self._last_due: float | None = None
        self.speaking = False

    def json(self, payload: bytes, tts: str | None = None, *, report: bool = True) -> bool:
        if self._closed:
            return False
        if len(self._queue) - self._audio_queued >= self._control_capacity:
            self._out.count_drop("downlink_control_overflow")
            return False
        self._queue.append(Json(payload, tts, report))
        if self._timer is None:  # armed: the head waits, and a new tail item changes nothing
            self._wake()
        return True

    def audio(self, opus: bytes) -> None:
        if self._closed:
            return
        if self._audio_queued >= self._capacity:
            self._out.count_drop("downlink_overflow")
            return
        self._queue.append(Audio(opus))
        self._audio_queued += 1
        if self._timer is None:
            self._wake()

    def clear(self) -> int:
        """Drop queued audio (control stays, in order); returns how many frames."""
        dropped = self._audio_queued
        if dropped:
            self._queue = deque(item for item in self._queue if isinstance(item, Json))
            self._audio_queued = 0
            self._disarm()  # the head may have changed: re-evaluate it
            if self._queue:
                self._wake()
        return dropped

    def reset(self) -> None:
        """The session is over: drop everything queued, control included (it named that
        session), and forget the speaking state."""
        self._queue.clear()
        self._audio_queued = 0
        self._last_due = None
        self.speaking = False
        self._disarm()

    def close(self) -> None:
        """The device is forgotten: everything dropped, nothing runs any more."""
        self._closed = True
        self.reset()
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None

    def set_frame_ms(self, frame_ms: int) -> None:
        """The frame duration the device's decoder was told (the server's hello)."""
        self._pacing = replace(self._pacing, frame_ms=frame_ms)

    @property
    def idle(self) -> bool:
        return not self._queue

    def _wake(self) -> None:
        if self._drain_handle is None and not self._draining:
            self._drain_handle = self._loop.call_soon(self._drain)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self._drain()

    def _drain(self) -> None:
        """Send every item that is due, in order; arm the timer for the first one that is not."""
        self._drain_handle = None
        self._disarm()  # woken before the head's due time: it is re-evaluated here
        self._draining = True
        try:
            while self._queue and not self._closed:
                item = self._queue[0]
                delay = self._delay(item)
                if delay > 0:
                    self._timer = self._loop.call_at(self._loop.time() + delay, self._fire)
                    return
                self._queue.popleft()
                try:
                    if isinstance(item, Audio):
                        self._audio_queued -= 1
                        self._play(item)
                    else:
                        self._control(item)
                except Exception:
                    self._out.count_failure()
                    log.exception("CHAT downlink: sending %s failed", type(item).__name__)
        finally:
            self._draining = False

    def _delay(self, item: Json | Audio) -> float:
        now = self._clock()
        if isinstance(item, Audio):
            due = self._due()
            if now > due + self._frame_s:  # the stream stalled (or never began): new burst
                self._start, self._played_ms = now, 0.0
                due = now
            return due - now
        if item.tts == "stop" and self._last_due is not None:
            return self._last_due + (self._pacing.prebuffer + 2) * self._frame_s - now
        return 0.0

    def _due(self) -> float:
        """When the next frame may go: the pre-buffer's worth at once, then as played."""
        ahead_ms = (self._pacing.prebuffer - 1) * self._pacing.frame_ms
        return self._start + max(0.0, self._played_ms - ahead_ms) / 1000

    def _play(self, item: Audio) -> None:
        self._last_due = self._due()
        ms = self._duration(item.opus)
        self._played_ms += ms if ms is not None else self._pacing.frame_ms
        if not self._out.send_audio(item.opus):  # the sender stamps headers (codec.counter_space)
            self._out.count_drop("downlink_refused")

    def _control(self, item: Json) -> None:
        self._out.publish_down(item.payload)
        if item.tts == "start":
            self.speaking = True
            self._start, self._played_ms = self._clock() + self._lead_s, 0.0
            self._last_due = None
        elif item.tts == "stop":
            self.speaking = False
            self._last_due = None
        if item.tts is not None and item.report:
            self._out.on_tts(item.tts)

    @property
    def _frame_s(self) -> float:
        return self._pacing.frame_ms / 1000
