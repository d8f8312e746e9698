"""The phrases a catalog's STEPS tasks will say, for SPEAK to synthesize ahead of use (pure).

Each task's ``speak`` steps and its generator's fixed lines
(:func:`gateway.tasks.dsl.exercises.exercise_phrases`), split into sentences as SPEAK splits
them before synthesis (:func:`gateway.speech.sentences.sentences`: the phrase cache keeps
sentences), as ``(voice, sentence)`` pairs: in catalog order, each once, only in the voices
the engine has.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.speech.sentences import sentences
from gateway.tasks.core import TaskDef
from gateway.tasks.core.steps import SpeakStepDef
from gateway.tasks.dsl.exercises import exercise_phrases


def catalog_phrases(tasks: Iterable[TaskDef], voices: frozenset[str]) -> list[tuple[str, str]]:
    """``(voice, sentence)`` of every fixed line the ``tasks`` say, in order, each once."""
    lines: list[tuple[str, str]] = []
    for task in tasks:
        lines += [(s.voice, s.text) for s in task.steps if isinstance(s, SpeakStepDef)]
        if task.generator is not None:
            voice: str = task.generator.voice if task.generator.kind != "idiom_chain" else "zh"
            lines += [(voice, text) for text in exercise_phrases(task.generator)]
    out: dict[tuple[str, str], None] = {}
    for voice, text in lines:
        if voice in voices:
            out.update(dict.fromkeys((voice, piece) for piece in sentences(text)))
    return list(out)
