"""expected_text resolution (SPEC §2.5) — pure; reading a resource file is an injected callable.

Order for clip ``i`` of a lesson (clips sorted):
  (a) ``transcripts[clip]`` or ``transcripts[stem]``;
  (b) ``<stem>.txt`` next to the clip in the local resource directory, i.e. the relative path
      ``<app_id>/<task_id>/lessons/<lesson_id>/<stem>.txt`` handed to ``read_text``;
  (c) ``sentences[i]``;
  (d) None — the step is not assessed; playback is unchanged.
The clip's path or name is never used as text. Blank texts count as missing.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from gateway.tasks.core.catalog import clip_stem

if TYPE_CHECKING:
    from gateway.tasks.core.catalog import LessonDef, TaskDef

#: Reads a UTF-8 text resource by relative POSIX path; None when absent or unreadable.
ReadText = Callable[[str], "str | None"]


class TextSource(StrEnum):
    TRANSCRIPT = "transcripts"
    TXT_FILE = "txt_file"
    SENTENCE = "sentences"
    NONE = "none"


def transcript_path(task: TaskDef, lesson: LessonDef, clip: str) -> str:
    """Relative path of the clip's ``.txt`` under the resource directory."""
    return f"{task.app_id}/{task.task_id}/lessons/{lesson.lesson_id}/{clip_stem(clip)}.txt"


def _text(value: str | None) -> str | None:
    if value is None:
        return None
    stripped = value.strip()
    return stripped or None


def resolve_with_source(
    task: TaskDef, lesson: LessonDef, index: int, read_text: ReadText | None = None
) -> tuple[str | None, TextSource]:
    """The expected text of ``lesson.clips[index]`` and which rule produced it."""
    if not 0 <= index < len(lesson.clips):
        return None, TextSource.NONE
    clip = lesson.clips[index]
    found = _text(lesson.transcripts.get(clip)) or _text(lesson.transcripts.get(clip_stem(clip)))
    if found is not None:
        return found, TextSource.TRANSCRIPT
    if read_text is not None:
        found = _text(read_text(transcript_path(task, lesson, clip)))
        if found is not None:
            return found, TextSource.TXT_FILE
    if index < len(lesson.sentences):
        found = _text(lesson.sentences[index])
        if found is not None:
            return found, TextSource.SENTENCE
    return None, TextSource.NONE


def resolve_expected_text(
    task: TaskDef, lesson: LessonDef, index: int, read_text: ReadText | None = None
) -> str | None:
    """SPEC §2.5 (a) → (b) → (c) → (d) for clip ``index`` of ``lesson``."""
    return resolve_with_source(task, lesson, index, read_text)[0]
