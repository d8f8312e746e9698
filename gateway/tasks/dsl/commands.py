"""What the step interpreter asks of the shell (typed command models) and what it is told.

Effects are performed in list order. Times are monotonic ms (the interpreter's ``now``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.tasks.core.steps import IndicatorState, SoundName, Voice


# -- effects: commands to the device ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SpeakCommand:
    """Say ``text`` through the SPEAK port (fire and forget; started/completed come back)."""

    speak_id: str
    text: str
    voice: Voice


@dataclass(frozen=True, slots=True)
class CancelSpeakCommand:
    speak_id: str


@dataclass(frozen=True, slots=True)
class PlayClipCommand:
    """PLAY_MEDIA of a lesson clip on the board (``name``: its board path)."""

    name: str


@dataclass(frozen=True, slots=True)
class SoundCommand:
    name: SoundName


@dataclass(frozen=True, slots=True)
class IndicateCommand:
    state: IndicatorState


@dataclass(frozen=True, slots=True)
class ListenOpenCommand:
    window_ms: int
    step_index: int


@dataclass(frozen=True, slots=True)
class ListenCloseCommand:
    pass


@dataclass(frozen=True, slots=True)
class TranscribeCommand:
    """Transcribe this utterance now (inline) and answer with :class:`TranscriptReady`."""

    utterance_id: str
    step_index: int
    expected_text: str | None


@dataclass(frozen=True, slots=True)
class DeferAssessmentCommand:
    """A plain listen step's utterance for the post-assessment side path (as today)."""

    utterance_id: str
    step_index: int


# -- effects: records -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepSignals:
    """One answered step's numbers: behaviour signals and the task's metrics (never a verdict).

    ``latency_ms``: window open → speech start (None: nothing said); ``completed``: 1 when the
    step ran to its end with a transcript, 0 when it was cut short (silence, ASR slow or failed,
    speech that never came)."""

    step_index: int
    prompt_text: str | None
    expected_text: str | None
    asr_text: str | None
    latency_ms: int | None
    completed: int
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InstanceSignals:
    """The instance's behaviour signals at its end: numbers only."""

    steps: int
    responded: int
    completed: int
    mean_latency_ms: int | None
    totals: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskEnded:
    reason: str  # "completed" | "stop_step" | "cancelled"


DslEffect = (
    SpeakCommand
    | CancelSpeakCommand
    | PlayClipCommand
    | SoundCommand
    | IndicateCommand
    | ListenOpenCommand
    | ListenCloseCommand
    | TranscribeCommand
    | DeferAssessmentCommand
    | StepSignals
    | InstanceSignals
    | TaskEnded
)


# -- events in --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SpeakBegan:
    speak_id: str


@dataclass(frozen=True, slots=True)
class SpeakFinished:
    speak_id: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class SpeakCut:
    speak_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClipFinished:
    """The board's audio.completed (``failed`` False) or audio.failed/stopped (True)."""

    failed: bool = False


@dataclass(frozen=True, slots=True)
class VoiceBegan:
    utterance_id: str


@dataclass(frozen=True, slots=True)
class VoiceEnded:
    utterance_id: str


@dataclass(frozen=True, slots=True)
class TranscriptReady:
    """ASR's answer for ``utterance_id``: ``text`` None when it failed."""

    utterance_id: str
    text: str | None


@dataclass(frozen=True, slots=True)
class DeadlinePassed:
    """The shell's timer fired; early firings are harmless."""


DslEvent = (
    SpeakBegan
    | SpeakFinished
    | SpeakCut
    | ClipFinished
    | VoiceBegan
    | VoiceEnded
    | TranscriptReady
    | DeadlinePassed
)
