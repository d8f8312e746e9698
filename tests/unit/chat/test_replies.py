"""Embedded engine rules: each rule, the fallback echo, and a failed recognition."""

from __future__ import annotations

from datetime import datetime

import pytest

from gateway.chat.replies import PHRASES, Reply, reply_to

NOW = datetime(2026, 12, 1, 9, 5)


@pytest.mark.parametrize(
    ("heard", "reply"),
    [
        (None, Reply("Sorry, I did not catch that. Please say it again.")),
        ("  ", Reply("Sorry, I did not catch that. Please say it again.")),
        ("goodbye", Reply("Goodbye! Talk to you soon.", end_session=True)),
        ("what time is it", Reply("It is 9 05.")),
        ("what is your name", Reply("I am your learning speaker.")),
        ("tell me a story", Reply("Once upon a time, a little fox learned a new word every day.")),
        ("thank you", Reply("You are welcome!")),
        ("start the lesson", Reply("Okay, let us start the lesson.", start_task=True)),
        ("begin lesson please", Reply("Okay, let us start the lesson.", start_task=True)),
        ("stop the lesson", Reply("You said: stop the lesson.")),
        ("Hello!", Reply("Hello! Nice to hear you.")),
        ("你好", Reply("Hello! Nice to hear you.")),
        ("green apples", Reply("You said: green apples.")),
    ],
)
def test_rules(heard: str | None, reply: Reply) -> None:
    assert reply_to(heard, NOW) == reply


def test_every_hint_phrase_gets_a_rule_not_the_echo() -> None:
    for phrase in PHRASES:
        assert not reply_to(phrase, NOW).text.startswith("You said")
