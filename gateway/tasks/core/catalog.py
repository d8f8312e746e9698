"""Task definitions (SPEC §5): pydantic models validated once at load, frozen afterwards.

A catalog file holds one task object or a JSON array of them. Clip lists are kept **sorted**
(the order clips play in and the order ``sentences[i]`` aligns with, SPEC §2.5(c)).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.tasks.core.rules import clamp_ratio
from gateway.tasks.core.steps import (
    AssessmentTiming,
    GenerateStepDef,
    GeneratorDef,
    PlayAudioStepDef,
    StepDef,
)

#: A safe board path segment: no slash, no leading dot (so no ``..``), no control characters.
_SEGMENT = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,63}$")
Segment = Annotated[str, Field(pattern=_SEGMENT.pattern)]
Mode = Literal["PLAY_AUDIO", "SHADOWING", "FOLLOW_READ", "LISTEN", "STEPS"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AssessmentDef(_Frozen):
    enabled: bool = True
    methods: tuple[str, ...] = ("text_similarity_v0",)
    defer: bool = True
    timing: AssessmentTiming = Field(
        "post", description="post: after the lesson (clock-stepped); inline: at once (STEPS)."
    )


SoundType = Literal["ding", "beep", "success", "error"]


class CuesDef(_Frozen):
    """The board's system sounds and logical states at the task's moments (spec D5, D10).

    A sound is one of ding, beep, success, error, or null for none at that moment.
    """

    task_start: SoundType | None = None
    window_open: SoundType | None = "ding"
    window_close: SoundType | None = None
    task_complete: SoundType | None = "success"
    error: SoundType | None = "error"
    indicate: bool = Field(
        True, description="INDICATE TASK_RUNNING/PLAYING/LISTENING/PROCESSING/ERROR/... too."
    )


class ButtonsDef(_Frozen):
    """What the board's key does during the task (device-capability spec D9)."""

    long: Literal["chat", "idle"] = Field(
        "chat",
        description="A long press stops the task; then back to CHAT (listening) or idle (quiet).",
    )


def clip_stem(clip: str) -> str:
    """``"01.mp3"`` → ``"01"`` (the name up to the last dot)."""
    return clip.rsplit(".", 1)[0] if "." in clip.lstrip(".") else clip


class LessonDef(_Frozen):
    lesson_id: Segment
    clips: tuple[Segment, ...] = ()
    transcripts: Mapping[str, str] = Field(default_factory=dict)
    sentences: tuple[str, ...] = ()
    durations_ms: Mapping[str, Annotated[int, Field(gt=0)]] = Field(default_factory=dict)

    @field_validator("clips")
    @classmethod
    def _sorted_unique(cls, clips: tuple[str, ...]) -> tuple[str, ...]:
        dupes = sorted({c for c in clips if clips.count(c) > 1})
        if dupes:
            raise ValueError(f"duplicate clips: {', '.join(dupes)}")
        return tuple(sorted(clips))

    @model_validator(mode="after")
    def _keys_name_clips(self) -> LessonDef:
        names = set(self.clips) | {clip_stem(c) for c in self.clips}
        for field, keys in (("transcripts", self.transcripts), ("durations_ms", self.durations_ms)):
            unknown = sorted(k for k in keys if k not in names)
            if unknown:
                raise ValueError(f"{field} keys name no clip of the lesson: {', '.join(unknown)}")
        return self

    def duration_ms(self, clip: str) -> int | None:
        return self.durations_ms.get(clip, self.durations_ms.get(clip_stem(clip)))


class TaskDef(_Frozen):
    app_id: Segment
    task_id: Segment
    interaction_mode: Mode
    title: str | None = None
    listen_ratio: float = Field(1.2, gt=0, description="Clamped into [1.2, 1.5] at load.")
    min_window_ms: int | None = Field(
        None, ge=0, description="Shortest window; None: the runtime setting (default 800)."
    )
    repeat: int = Field(1, ge=1, le=1000, description="PLAY_AUDIO: loops the board plays.")
    listen_ms: int = Field(5_000, gt=0, description="LISTEN: length of the one window.")
    volume: int | None = Field(
        None, ge=0, le=100, description="PLAY_MEDIA volume (0-100); None: the board's own."
    )
    speed: float = Field(1.0, gt=0, description="PLAY_MEDIA speed; clamped into [0.5, 2.0].")
    buttons: ButtonsDef = ButtonsDef()
    cues: CuesDef = CuesDef()
    assessment: AssessmentDef = AssessmentDef()
    lessons: tuple[LessonDef, ...]
    steps: tuple[StepDef, ...] = Field((), description="STEPS: the task DSL's step list.")
    generator: GeneratorDef | None = Field(None, description="STEPS: makes `generate` steps.")

    @model_validator(mode="after")
    def _lessons_fit_mode(self) -> TaskDef:
        if not self.lessons:
            raise ValueError("a task needs at least one lesson")
        ids = [lesson.lesson_id for lesson in self.lessons]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate lesson_id: {', '.join(dupes)}")
        if self.interaction_mode == "STEPS":
            self._check_steps()
            return self
        if self.steps or self.generator is not None:
            raise ValueError("steps and generator need interaction_mode STEPS")
        if self.assessment.timing == "inline":
            raise ValueError(
                "assessment.timing inline needs interaction_mode STEPS "
                "(clock-stepped modes are assessed post)"
            )
        if self.interaction_mode != "LISTEN":
            empty = [lesson.lesson_id for lesson in self.lessons if not lesson.clips]
            if empty:
                raise ValueError(f"lessons without clips: {', '.join(empty)}")
        return self

    def _check_steps(self) -> None:
        if not self.steps:
            raise ValueError("steps: a STEPS task needs at least one step")
        generates = any(isinstance(step, GenerateStepDef) for step in self.steps)
        if generates and self.generator is None:
            raise ValueError("generator: a `generate` step needs the task's generator")
        if generates and self.assessment.timing != "inline":
            raise ValueError("assessment.timing: generated questions are assessed inline")
        if self.generator is not None and self.generator.start_length > self.generator.max_length:
            raise ValueError("generator.start_length is longer than generator.max_length")
        for n, step in enumerate(self.steps):
            if isinstance(step, PlayAudioStepDef):
                for lesson in self.lessons:
                    if step.clip not in lesson.clips:
                        raise ValueError(
                            f"steps[{n}].clip: {step.clip!r} is not a clip of lesson "
                            f"{lesson.lesson_id}"
                        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.app_id, self.task_id)

    @property
    def effective_ratio(self) -> float:
        return clamp_ratio(self.listen_ratio)

    def lesson(self, lesson_id: str | None) -> LessonDef | None:
        """The named lesson, or the first one when ``lesson_id`` is None."""
        if lesson_id is None:
            return self.lessons[0]
        return next((x for x in self.lessons if x.lesson_id == lesson_id), None)

    def board_path(self, lesson: LessonDef, clip: str) -> str:
        """``/{app_id}/{task_id}/lessons/{lesson_id}/{clip}`` (seed §9)."""
        return f"/{self.app_id}/{self.task_id}/lessons/{lesson.lesson_id}/{clip}"


class Catalog:
    """All tasks by ``(app_id, task_id)``; immutable after construction."""

    def __init__(self, tasks: Mapping[tuple[str, str], TaskDef] | None = None) -> None:
        self._tasks: dict[tuple[str, str], TaskDef] = dict(tasks or {})

    def get(self, app_id: str, task_id: str) -> TaskDef | None:
        return self._tasks.get((app_id, task_id))

    def __iter__(self) -> Iterator[TaskDef]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)
