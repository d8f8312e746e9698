"""What a device actor (:mod:`gateway.tasks.actor`) is built with: its ports (the rest of the
gateway, as the task runtime sees it) and its metrics (one family for every actor)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.metrics import Metrics
from gateway.tasks.core import ControlReply, PublishTaskEvent
from gateway.tasks.ports import (
    AnswerKeeper,
    CommandSender,
    DeviceTasks,
    InlineAssessment,
    MicControl,
    ModeListener,
    Recorder,
    SpeakPort,
    UtteranceSink,
)


class ActorMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.lateness = metrics.quantiles(
            "window_lateness_ms", "Listen window close: actual minus planned (ms)"
        )
        self.next_clip_gap = metrics.quantiles(
            "next_clip_gap_ms",
            "Listen window close to the board's ack of the next clip's play command (ms)",
        )
        self.windows = metrics.counter("windows_closed", "Listen windows closed by the timer")
        self.ignored = metrics.counter(
            "runtime_ignored", "Events that changed nothing, by event type", ["event"]
        )
        self.dropped = metrics.counter("runtime_inbox_dropped", "Events dropped: actor inbox full")
        self.failed = metrics.counter(
            "runtime_event_failures", "Events whose handling raised (logged; the actor goes on)"
        )
        self.commands = metrics.counter(
            "runtime_commands", "Commands asked by the runtime", ["cmd"]
        )
        self.utterances = metrics.counter(
            "runtime_utterances_submitted", "Utterances handed to assessment"
        )
        self.utterances_missing = metrics.counter(
            "runtime_utterances_missing", "Utterances submitted without audio (evicted or empty)"
        )
        self.task_events = metrics.counter("runtime_task_events", "Lifecycle events", ["event"])
        self.cancelled = metrics.counter(
            "runtime_instances_cancelled",
            "Instances cancelled (preempted, stopped, ...)",
            ["reason"],
        )
        self.step_failures = metrics.counter(
            "runtime_step_failures",
            "Steps advanced empty (watchdog, audio.failed, ...)",
            ["reason"],
        )


@dataclass(frozen=True)
class Ports:
    commands: CommandSender
    mic: MicControl
    recorder: Recorder
    assessment: UtteranceSink
    publish_task_event: Callable[[str, PublishTaskEvent], None]
    publish_reply: Callable[[str, ControlReply], None]
    now_ms: Callable[[], float]
    # (app_id, task_id, lesson_id) → (assessment methods, or () when off; the lesson's texts)
    plan: Callable[[str, str, str], tuple[tuple[str, ...], tuple[str, ...]]]
    modes: ModeListener | None = None  # CHAT: suspended while a task runs
    archive: AnswerKeeper | None = None  # the learning record's audio (None: not kept)
    devices: DeviceTasks | None = None  # a device's own executor (Xiaozhi task/mode JSON)
    speaker: SpeakPort | None = None  # SPEAK: STEPS tasks say their lines through it
    inline: InlineAssessment | None = None  # STEPS tasks: ASR at once, numbers recorded
