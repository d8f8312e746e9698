"""Splitting a line into the sentences spoken one by one (pure)."""

from __future__ import annotations

import pytest

from gateway.speech.sentences import sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Well done! Now say it backwards.", ["Well done!", "Now say it backwards."]),
        ("What is 3.5 plus 1?  Take your time", ["What is 3.5 plus 1?", "Take your time"]),
        ("太棒了！七加二等于几？", ["太棒了！", "七加二等于几？"]),  # noqa: RUF001
        ("对了。Next one; ready?", ["对了。", "Next one;", "ready?"]),
        ("line one\n\nline two", ["line one", "line two"]),
        ("No end mark", ["No end mark"]),
        ("   ", []),
        ("", []),
    ],
)
def test_sentences(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected
