"""SPEC §2.5: transcripts -> <stem>.txt -> sentences[i] -> None; never the clip path."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tasks.core import TaskDef, TextSource, resolve_expected_text, resolve_with_source
from gateway.tasks.core.expected import transcript_path

TASK: dict[str, Any] = {
    "app_id": "app",
    "task_id": "shadowing",
    "interaction_mode": "SHADOWING",
    "lessons": [
        {
            "lesson_id": "u1",
            "clips": ["05.mp3", "01.mp3", "02.mp3", "03.mp3", "04.mp3"],
            "transcripts": {"01.mp3": "From clip key.", "02": "From stem key.", "03": "   "},
            "sentences": ["s0", "s1", "s2", "s3", " "],
        }
    ],
}
FILES = {
    "app/shadowing/lessons/u1/01.txt": "file 01 loses to transcripts",
    "app/shadowing/lessons/u1/03.txt": "  From the txt file.\n",
    "app/shadowing/lessons/u1/05.txt": "\n",
}


def read(path: str) -> str | None:
    return FILES.get(path)


@pytest.mark.parametrize(
    ("index", "reader", "text", "source"),
    [
        (0, read, "From clip key.", TextSource.TRANSCRIPT),  # (a) by clip name
        (1, read, "From stem key.", TextSource.TRANSCRIPT),  # (a) by stem
        (2, read, "From the txt file.", TextSource.TXT_FILE),  # blank transcript -> (b)
        (2, None, "s2", TextSource.SENTENCE),  # no reader -> (c)
        (3, read, "s3", TextSource.SENTENCE),  # no file -> (c) aligned to the SORTED clip list
        (4, read, None, TextSource.NONE),  # blank file, blank sentence -> (d)
        (5, read, None, TextSource.NONE),  # out of range
        (-1, read, None, TextSource.NONE),
    ],
)
def test_resolution_order(index: int, reader: Any, text: str | None, source: TextSource) -> None:
    task = TaskDef.model_validate(TASK)
    lesson = task.lessons[0]
    assert lesson.clips == ("01.mp3", "02.mp3", "03.mp3", "04.mp3", "05.mp3")
    assert resolve_with_source(task, lesson, index, reader) == (text, source)
    assert resolve_expected_text(task, lesson, index, reader) == text


def test_never_derived_from_the_clip_path() -> None:
    task = TaskDef.model_validate(
        {**TASK, "lessons": [{"lesson_id": "u1", "clips": ["good_morning.mp3"]}]}
    )
    seen: list[str] = []

    def spy(path: str) -> str | None:
        seen.append(path)
        return None

    assert resolve_expected_text(task, task.lessons[0], 0, spy) is None
    assert seen == ["app/shadowing/lessons/u1/good_morning.txt"]
    assert transcript_path(task, task.lessons[0], "x.y.mp3") == "app/shadowing/lessons/u1/x.y.txt"
