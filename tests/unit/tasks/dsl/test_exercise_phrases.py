"""The fixed lines each exercise can say (``exercise_phrases``): what SPEAK prepares ahead."""

from __future__ import annotations

import pytest

from gateway.speech.sentences import sentences
from gateway.tasks.core.steps import GeneratorDef
from gateway.tasks.dsl.exercises import exercise_phrases, make_exercise


@pytest.mark.parametrize("voice", ["en", "zh"])
def test_arithmetic_lists_every_question_and_feedback_a_lesson_can_say(voice: str) -> None:
    spec = GeneratorDef(kind="arithmetic_10", voice=voice)  # type: ignore[arg-type]
    phrases = set(exercise_phrases(spec))
    # 110 questions, "right" for each result 0..10 (one line in English), "it is N" for
    # each, the neutral line
    assert len(phrases) == len(exercise_phrases(spec))
    assert len(phrases) == 110 + (1 if voice == "en" else 11) + 11 + 1
    for seed in (1, 2):
        sums = make_exercise(spec, seed)
        assert sums.neutral() in phrases
        for _ in range(110):
            question = sums.question()
            assert question.text in phrases
            for said in (question.expected, "nine nine", None):
                assert sums.reply(question, said).feedback in phrases


@pytest.mark.parametrize("voice", ["en", "zh"])
def test_reverse_digits_lists_its_fixed_sentences_not_the_digits(voice: str) -> None:
    spec = GeneratorDef(kind="reverse_digits", voice=voice)  # type: ignore[arg-type]
    phrases = exercise_phrases(spec)
    game = make_exercise(spec, 3)
    question = game.question()
    right = game.reply(question, " ".join(question.expected.split()))
    assert phrases == (game.neutral(), sentences(right.feedback)[0])
    assert len(sentences(right.feedback)) == 2  # the digits are a sentence of their own


def test_idiom_chain_lists_its_neutral_line() -> None:
    spec = GeneratorDef(kind="idiom_chain", voice="zh")
    assert exercise_phrases(spec) == (make_exercise(spec, 0).neutral(),)
