"""The task DSL's step list (issue #27, device-capability spec §15): validated once at load.

A ``STEPS`` task is a list of steps run one after the other by the step interpreter
(:mod:`gateway.tasks.dsl`)::

    speak       say ``text`` with ``voice`` (en | zh) through the SPEAK port
    play_audio  play a clip of the lesson on the board (``clip``: a name in the lesson's clips)
    wait        do nothing for ``ms``
    listen      open a listen window of ``window_ms``; with ``assessment.timing = inline`` the
                answer is transcribed and assessed at once and the feedback spoken before the
                next step
    sound       a short cue on the board (ding | beep | success | error)
    indicate    the board's light/screen state (IDLE, LISTENING, ...)
    generate    ``rounds`` questions made by the task's ``generator``: each round is
                speak(question) → listen(window_ms) → inline assessment → spoken feedback
    stop        end the task here

Every model forbids unknown keys, so ``snlpgw catalog check`` names a misspelt field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Voice = Literal["en", "zh"]
SoundName = Literal["ding", "beep", "success", "error"]
IndicatorState = Literal[
    "IDLE", "LISTENING", "PROCESSING", "PLAYING", "ERROR", "TASK_RUNNING", "TASK_COMPLETE"
]
GeneratorKind = Literal["reverse_digits", "arithmetic_10", "idiom_chain"]
AssessmentTiming = Literal["post", "inline"]


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpeakStepDef(_Step):
    type: Literal["speak"]
    text: str = Field(min_length=1, max_length=500)
    voice: Voice = "en"


class PlayAudioStepDef(_Step):
    type: Literal["play_audio"]
    clip: str = Field(min_length=1, max_length=64)


class WaitStepDef(_Step):
    type: Literal["wait"]
    ms: int = Field(gt=0, le=600_000)


class ListenStepDef(_Step):
    type: Literal["listen"]
    window_ms: int = Field(5_000, gt=0, le=120_000)


class SoundStepDef(_Step):
    type: Literal["sound"]
    name: SoundName


class IndicateStepDef(_Step):
    type: Literal["indicate"]
    state: IndicatorState


class GenerateStepDef(_Step):
    type: Literal["generate"]
    rounds: int = Field(gt=0, le=50)
    window_ms: int = Field(6_000, gt=0, le=120_000)


class StopStepDef(_Step):
    type: Literal["stop"]


StepDef = Annotated[
    SpeakStepDef
    | PlayAudioStepDef
    | WaitStepDef
    | ListenStepDef
    | SoundStepDef
    | IndicateStepDef
    | GenerateStepDef
    | StopStepDef,
    Field(discriminator="type"),
]


class GeneratorDef(BaseModel):
    """The question generator behind ``generate`` steps; its parameters are per kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: GeneratorKind
    voice: Voice = "en"
    start_length: int = Field(3, ge=2, le=9, description="reverse_digits: first length.")
    max_length: int = Field(6, ge=2, le=9, description="reverse_digits: longest length.")
    seed_idiom: str | None = Field(None, description="idiom_chain: the first idiom (else drawn).")
