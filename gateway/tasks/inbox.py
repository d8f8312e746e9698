"""The task service's inbox: what the other components tell the task runtime, as typed events in
one bounded FIFO created BEFORE them (so none needs a reference to the task service).

Producers: the board channel (board events, buttons, presence, via ``BoardToTasks``), the Xiaozhi
voice sink (speech started/stopped, via ``VoiceToTasks``), SPEAK (speak started/completed/
interrupted, the task DSL), the assessment side path (ASR text),
CHAT (a task asked for by voice), the cluster (ownership changed) and the control topic. The
:class:`~gateway.tasks.service.TaskService` drains it in its ``run`` and hands each event to its
device's actor, so every input of a device reaches its runtime in the order it arrived, except
that a start, restart or resume request waiting for its admission slot is overtaken by its
device's board events (its device's later control requests wait behind it:
:mod:`gateway.tasks.starts`).

Queue policy: bounded (``INBOX_LIMIT`` events). The consumer never awaits between events, so the
inbox is empty after every loop turn in which the service runs; it fills only if the service is
not running or the loop is starved. Then a new event is dropped, counted
(``task_inbox_dropped{event}``) and logged, like a full actor inbox (``actor.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway.metrics import Metrics
from gateway.tasks.core import ControlAction, ControlRequest, PlaybackEvent, PriorityLevel

log = logging.getLogger(__name__)

INBOX_LIMIT = 65_536


@dataclass(frozen=True, slots=True)
class InboxBoardEvent:
    device: str
    event: PlaybackEvent


@dataclass(frozen=True, slots=True)
class InboxButton:
    device: str
    kind: str
    key: str | None = None


@dataclass(frozen=True, slots=True)
class InboxPresence:
    device: str
    online: bool


@dataclass(frozen=True, slots=True)
class InboxSpeechStarted:
    device: str
    utterance_id: str


@dataclass(frozen=True, slots=True)
class InboxSpeechStopped:
    device: str
    utterance_id: str
    pcm: bytes
    duration_ms: int
    packets: tuple[bytes, ...] = ()  # the device's Opus packets (the archive's)


@dataclass(frozen=True, slots=True)
class InboxAsrText:
    device: str
    instance_id: str
    step_index: int
    text: str


@dataclass(frozen=True, slots=True)
class InboxSpeak:
    """SPEAK's result for ``speak_id``: phase started | completed | interrupted."""

    device: str
    speak_id: str
    phase: str
    duration_ms: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class InboxControl:
    """A control request already parsed (control topic) or made here (voice start)."""

    device: str
    request: ControlRequest


@dataclass(frozen=True, slots=True)
class InboxOwnersChanged:
    """The cluster's ownership may have changed: release devices owned elsewhere, adopt new."""


TaskInput = (
    InboxBoardEvent
    | InboxButton
    | InboxPresence
    | InboxSpeechStarted
    | InboxSpeechStopped
    | InboxAsrText
    | InboxSpeak
    | InboxControl
    | InboxOwnersChanged
)


class TaskInbox:
    """The producers' side has one method per event; the task service ``get``s them."""

    def __init__(self, *, metrics: Metrics, limit: int = INBOX_LIMIT) -> None:
        # Bounded: ``limit`` events; overflow drops the new event, counted (module doc).
        self._queue: asyncio.Queue[TaskInput] = asyncio.Queue(limit)
        self._dropped = metrics.counter(
            "task_inbox_dropped",
            "Events for the task runtime dropped: its inbox was full",
            ["event"],
        )

    def put(self, item: TaskInput) -> bool:
        if self._queue.full():
            self._dropped.labels(type(item).__name__).inc()
            log.error("task inbox full: dropped %s", type(item).__name__)
            return False
        self._queue.put_nowait(item)
        return True

    async def get(self) -> TaskInput:
        return await self._queue.get()

    def __len__(self) -> int:
        return self._queue.qsize()

    # -- producers --------------------------------------------------------------------------

    def board_event(self, device: str, event: PlaybackEvent) -> None:
        self.put(InboxBoardEvent(device, event))

    def button(self, device: str, kind: str, key: str | None = None) -> None:
        self.put(InboxButton(device, kind, key))

    def presence(self, device: str, online: bool) -> None:
        self.put(InboxPresence(device, online))

    def speech_started(self, device: str, utterance_id: str) -> None:
        self.put(InboxSpeechStarted(device, utterance_id))

    def speech_stopped(
        self,
        device: str,
        utterance_id: str,
        pcm: bytes,
        duration_ms: int,
        packets: tuple[bytes, ...] = (),
    ) -> None:
        self.put(InboxSpeechStopped(device, utterance_id, pcm, duration_ms, packets))

    def asr_text(self, device: str, instance_id: str, step_index: int, text: str) -> None:
        self.put(InboxAsrText(device, instance_id, step_index, text))

    def speak_started(self, dev: str, speak_id: str) -> None:
        self.put(InboxSpeak(dev, speak_id, "started"))

    def speak_completed(self, dev: str, speak_id: str, duration_ms: int) -> None:
        self.put(InboxSpeak(dev, speak_id, "completed", duration_ms=duration_ms))

    def speak_interrupted(self, dev: str, speak_id: str, reason: str) -> None:
        self.put(InboxSpeak(dev, speak_id, "interrupted", reason=reason))

    def control(self, device: str, request: ControlRequest) -> None:
        self.put(InboxControl(device, request))

    def start_by_voice(self, device: str, app_id: str, task_id: str, lesson_id: str) -> None:
        """A task the child asked for in CHAT: priority 1 (voice), so anything running at a
        higher priority refuses it ``busy`` and any later request >= 1 preempts it."""
        request = ControlRequest(
            action=ControlAction.START,
            request_id=f"voice-{time.monotonic_ns():x}",
            app_id=app_id,
            task_id=task_id,
            lesson_id=lesson_id,
            priority=PriorityLevel.VOICE,
            source="voice",
        )
        self.put(InboxControl(device, request))

    def owners_changed(self) -> None:
        self.put(InboxOwnersChanged())
