"""Values that cross the ASR boundary: jobs in, results or typed failures out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

SAMPLE_RATE = 16_000
SAMPLE_BYTES = 2  # s16le mono

OnTranscript = Callable[[str | None], None]  # the text, or None (failed or dropped)

# A step's assessment_shed when its window was only captured: its audio is archived undecoded,
# for `snlpgw reassess`. voice_overload: the gateway's loop could not decode it (voice
# overload); asr_saturated: the ASR could not have taken its answer (gateway.assessment.claims).
SHED_VOICE_OVERLOAD = "voice_overload"
SHED_ASR_SATURATED = "asr_saturated"


def audio_ms(pcm: bytes) -> float:
    return len(pcm) / SAMPLE_BYTES / SAMPLE_RATE * 1000


@dataclass(frozen=True, slots=True)
class AsrKey:
    """Opaque to the pool: matches a result to the utterance it came from."""

    instance_id: str
    step_index: int
    utterance_id: str

    @property
    def step(self) -> tuple[str, int]:
        """Jobs with the same step supersede each other while queued (the last one counts)."""
        return (self.instance_id, self.step_index)


class AnswerGrammar(StrEnum):
    """What kind of answer an utterance is, when the task knows it (inline number tasks).

    An engine that can constrain its search (pocketsphinx: a JSGF grammar,
    :mod:`gateway.assessment.grammar`) hears only that kind of answer or one of a few common
    non-answers ("i don't know", "again", ...); one that cannot (the HTTP engine) ignores it
    and uses the hints. English only: the grammars' words are English.
    """

    NUMBER = "number"  # a number 0-10, optionally after a short carrier ("it is", ...)
    DIGITS = "digits"  # digit words said one by one ("three five seven")


@dataclass(frozen=True, slots=True)
class AsrJob:
    key: AsrKey
    pcm: bytes = field(repr=False)  # 16 kHz s16le mono
    # Sentences of the lesson the utterance belongs to; an engine may use them as a language
    # model prior (pocketsphinx does), never as the answer. Empty: generic recognition.
    hints: tuple[str, ...] = ()
    # The answer's kind, for engines that can constrain recognition to it (None: free speech).
    grammar: AnswerGrammar | None = None
    # Nobody waits longer than this (ms after submit): a job still queued then is withdrawn
    # at dequeue, never transcribed (inline ASR: the task has spoken its neutral line by then).
    # None: kept until run (post-assessment).
    max_wait_ms: float | None = None
    # An archived answer taken up again (catch-up): the full queue sheds it before any live one.
    late: bool = False


@dataclass(frozen=True, slots=True)
class AsrResult:
    text: str  # may be empty: nothing recognised
    engine: str
    audio_ms: float
    elapsed_ms: float


class FailureReason(StrEnum):
    BAD_AUDIO = "bad_audio"
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    TIMEOUT = "timeout"
    WORKER_CRASHED = "worker_crashed"
    HTTP_STATUS = "http_status"
    CONNECTION = "connection"
    BAD_RESPONSE = "bad_response"


@dataclass(frozen=True, slots=True)
class AsrFailure:
    reason: FailureReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class AsrOutcome:
    """What the pool hands back on the loop for every job it did not drop."""

    key: AsrKey
    result: AsrResult | AsrFailure
    latency_ms: float  # submit → outcome


def check_pcm(pcm: bytes) -> AsrFailure | None:
    """Typed error for audio no engine can take (odd byte count)."""
    if len(pcm) % SAMPLE_BYTES:
        return AsrFailure(FailureReason.BAD_AUDIO, f"{len(pcm)} bytes is not whole s16 samples")
    return None
